"""The gRPC front door's API key check: a server interceptor in front of every method but the open ones.

    call ─▶ open method? (TetriServe/Health, grpc.health.v1.Health/Check) ─▶ the servicer
         └─▶ KeyTable.check(`authorization` metadata, "Bearer <key>")
                MISSING / INVALID ─▶ UNAUTHENTICATED "Incorrect API key provided." / "You didn't provide ..."
                RATE_LIMITED      ─▶ RESOURCE_EXHAUSTED + trailer retry-after=<s> (the admission gate's shape:
                                     the SDK raises ResourceExhausted with retry_after_s)
                ALLOWED           ─▶ the servicer

Generate, Abort, ClusterStatus and the admin calls (SetPolicy, Flip, Scale) all need a key. A refused call
is answered by a handler of the same kind that aborts at once: the request is never parsed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import grpc.aio

from tetriserve.client.errors import RETRY_AFTER_METADATA_KEY
from tetriserve.frontdoor.key_table import AuthOutcome, AuthResult
from tetriserve.frontdoor.security import FrontDoorSecurity

logger = logging.getLogger(__name__)

AUTHORIZATION_METADATA_KEY = "authorization"


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no type information
    """Refuses calls without a valid ``authorization: Bearer <key>`` (UNAUTHENTICATED) or over quota."""

    def __init__(self, security: FrontDoorSecurity) -> None:
        self._security = security

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        keys = self._security.keys
        method = handler_call_details.method
        if keys is None or self._security.method_is_open(method):
            return await continuation(handler_call_details)
        result = keys.check(_metadata(handler_call_details, AUTHORIZATION_METADATA_KEY))
        handler = await continuation(handler_call_details)
        if result.allowed or handler is None:  # None: an unknown method, gRPC answers UNIMPLEMENTED
            return handler
        logger.debug("refused %s: %s", method, result.outcome.value)
        return _refusing(handler, result)


def _refusing(handler: grpc.RpcMethodHandler, result: AuthResult) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that aborts with ``result``'s status."""
    if result.outcome is AuthOutcome.RATE_LIMITED:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        trailer: tuple[tuple[str, str], ...] = ((RETRY_AFTER_METADATA_KEY, str(result.retry_after_whole_s)),)
    else:
        code, trailer = grpc.StatusCode.UNAUTHENTICATED, ()

    async def abort(_: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, result.message(), trailing_metadata=trailer)

    async def abort_stream(_: object, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await context.abort(code, result.message(), trailing_metadata=trailer)
        yield  # never reached: abort raises

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(abort)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(abort_stream)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(abort)
    return grpc.stream_stream_rpc_method_handler(abort_stream)


def _metadata(details: grpc.HandlerCallDetails, key: str) -> str | None:
    for k, v in details.invocation_metadata or ():
        if k == key:
            return v.decode("latin-1") if isinstance(v, bytes) else str(v)
    return None
