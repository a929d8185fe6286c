"""Exceptions raised by the SDK: one per gRPC status a caller handles differently.

Every exception is a ``TetriServeError`` carrying the gRPC ``code``, the
server's ``details`` and the ``request_id`` when one was involved::

    TetriServeError
    ├── InvalidArgument    bad input; ``field`` names it (e.g. "sampling.top_p")
    ├── NotFound           no such worker (``set_policy``, ``flip``)
    ├── FailedPrecondition an admin order that cannot be carried out now (``flip``, ``scale``); ``details`` says why
    ├── DeadlineExceeded   the ``timeout`` passed before the call finished
    ├── Unavailable        the service could not be reached (retried before the first token)
    ├── ResourceExhausted  refused: the service is full or the key over its quota (``retry_after_s``), or too big
    ├── Cancelled          the call was cancelled (by the server, or by closing the client)
    ├── Unauthenticated    no API key, or a wrong one (``api_key=`` / ``$TETRISERVE_API_KEY``)
    └── InternalError      the request failed inside the cluster; ``details`` says why
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

FIELD_METADATA_KEY = "tetriserve-field"
RETRY_AFTER_METADATA_KEY = "retry-after"  # on RESOURCE_EXHAUSTED: seconds until the service expects room


class TetriServeError(Exception):
    """Base class of every SDK error."""

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        request_id: str | None = None,
    ) -> None:
        prefix = f"[{code.name}] " if code is not None else ""
        suffix = f" (request_id={request_id})" if request_id else ""
        super().__init__(f"{prefix}{details}{suffix}")
        self.code = code
        self.details = details
        self.request_id = request_id


class InvalidArgument(TetriServeError):
    """The server rejected the request; ``field`` names the offending input when known."""

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = grpc.StatusCode.INVALID_ARGUMENT,
        request_id: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(details, code=code, request_id=request_id)
        self.field = field


class NotFound(TetriServeError):
    """The call named something the server does not have (e.g. an unknown worker id)."""


class FailedPrecondition(TetriServeError):
    """An admin order the service cannot carry out now (e.g. flipping the last worker of a role)."""


class DeadlineExceeded(TetriServeError):
    """The call's ``timeout`` expired."""


class Unavailable(TetriServeError):
    """The service was unreachable (after any retries the policy allowed)."""


class ResourceExhausted(TetriServeError):
    """The service refused the call: it is at its admission bound or the API key is over its quota
    (``retry_after_s`` says when to come back), or the request is over its size limit (``retry_after_s`` None)."""

    retry_after_s: float | None = None


class Cancelled(TetriServeError):
    """The call was cancelled by the server or because the client was closed."""


class Unauthenticated(TetriServeError):
    """The service wants an API key and the call had none, or a wrong one."""


class InternalError(TetriServeError):
    """The request failed inside the cluster (or the server hit a bug)."""


_BY_CODE: dict[grpc.StatusCode, type[TetriServeError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
}


def _field_from(metadata: Iterable[tuple[str, str | bytes]] | None, details: str) -> str | None:
    for key, value in metadata or ():
        if key == FIELD_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else value
    head, sep, _ = details.partition(":")
    return head.strip() if sep and " " not in head.strip() else None


def from_rpc_error(err: grpc.RpcError, request_id: str | None = None) -> TetriServeError:
    """Translate a ``grpc.RpcError`` (sync or aio) into the matching SDK exception."""
    code_fn = getattr(err, "code", None)
    code: grpc.StatusCode | None = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(err)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        metadata_fn = getattr(err, "trailing_metadata", None)
        metadata = metadata_fn() if callable(metadata_fn) else None
        return InvalidArgument(details, request_id=request_id, field=_field_from(metadata, details))
    cls = _BY_CODE.get(code, TetriServeError) if code is not None else TetriServeError
    error = cls(details, code=code, request_id=request_id)
    if isinstance(error, ResourceExhausted):
        error.retry_after_s = retry_after_s(err)
    return error


def retry_after_s(err: grpc.RpcError) -> float | None:
    """The ``retry-after`` seconds a refusal carries, if any."""
    metadata_fn = getattr(err, "trailing_metadata", None)
    for key, value in (metadata_fn() if callable(metadata_fn) else None) or ():
        if key == RETRY_AFTER_METADATA_KEY:
            return float(value.decode() if isinstance(value, bytes) else value)
    return None
