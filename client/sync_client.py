"""Blocking gRPC client of the tetriserve front door.

Example::

    with TetriServeClient("localhost:50051") as client:
        for chunk in client.generate("Hello", max_tokens=32, timeout=30):
            print(chunk.text, end="", flush=True)
        print(client.complete([1, 2, 3], max_tokens=8).token_ids)

``generate`` returns a ``ResponseStream``: iterate it for ``Chunk``s, read its
``request_id`` before the first token (for ``abort`` from another thread) and
``cancel()`` it or leave its ``with`` block to stop early — the server then
aborts the request. ``UNAVAILABLE`` is retried per ``RetryPolicy`` until the
first response arrives, never after. ``api_key`` (default ``$TETRISERVE_API_KEY``)
and ``tls`` / ``root_certificates`` as in ``client/credentials.py``::

    TetriServeClient("svc.example:50051", api_key="sk-...", tls=True)                 # system roots
    TetriServeClient("localhost:50051", api_key="sk-...", root_certificates="ca.pem")  # a private CA
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import grpc

from tetriserve.client.credentials import Metadata, auth_metadata, channel_credentials, resolve_api_key
from tetriserve.client.errors import from_rpc_error
from tetriserve.client.options import GenerateOptions, build_generate_request, build_set_policy_request, with_request_id
from tetriserve.client.results import Chunk, ClusterStatus, Completion, CompletionCollector, HealthStatus, PolicyUpdate
from tetriserve.client.retry import Deadline, RetryPolicy, retry_delay
from tetriserve.client.stubs import GenerateCall, Stub, UnaryCall, sync_stub
from tetriserve.protos import tetriserve_pb2 as pb

logger = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class ResponseStream:
    """The chunks of one ``generate`` call; an iterator and a context manager."""

    def __init__(
        self,
        stub: Stub,
        request: pb.GenerateRequest,
        deadline: Deadline,
        policy: RetryPolicy,
        metadata: Metadata | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._metadata = metadata
        self._stub = stub
        self._request = request
        self._deadline = deadline
        self._policy = policy
        self._call: GenerateCall | None = None  # the attempt in progress
        self._cancelled = False
        self._chunks = self._run()

    def __iter__(self) -> ResponseStream:
        return self

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def cancel(self) -> None:
        """Stop the stream; the server aborts the request. Safe from any thread."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()
        self._chunks.close()

    def _run(self) -> Generator[Chunk, None, None]:
        failed = 0
        got_response = False
        while True:
            call = self._stub.Generate(self._request, timeout=self._deadline.remaining(), metadata=self._metadata)
            self._call = call
            if self._cancelled:
                call.cancel()
            try:
                for msg in call:
                    got_response = True
                    yield Chunk.from_proto(msg)
                return
            except grpc.RpcError as err:
                if self._cancelled:
                    return
                failed += 1
                delay = retry_delay(self._policy, err, failed, self._deadline, got_response)
                if delay is None:
                    raise from_rpc_error(err, self.request_id) from None
                logger.info("request %s: attempt %s unavailable, retrying in %.2fs", self.request_id, failed, delay)
                time.sleep(delay)
            finally:
                call.cancel()  # no-op once finished; stops the server when the consumer left early


class TetriServeClient:
    """Blocking client; one channel, safe to share between threads."""

    def __init__(
        self,
        target: str = "localhost:50051",
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, object]] = (),
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | os.PathLike[str] | None = None,
    ) -> None:
        """Connect (lazily) to ``target``.

        Args:
            target: ``host:port`` of the gRPC gateway.
            retry: retry policy for ``UNAVAILABLE`` (default ``RetryPolicy()``).
            timeout: default per-call timeout in seconds (``None``: no deadline).
            credentials: channel credentials used as given (instead of ``tls``/``root_certificates``).
            channel_options: extra gRPC channel arguments.
            api_key: sent as ``authorization: Bearer <key>``; ``None`` reads ``$TETRISERVE_API_KEY``, ``""``
                sends none.
            tls: TLS, verifying the server against the system's root certificates.
            root_certificates: TLS, verifying the server against this CA or certificate (PEM bytes/text or
                a path); implies ``tls``.
        """
        self.target = target
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._metadata = auth_metadata(resolve_api_key(api_key))
        credentials = channel_credentials(credentials, tls, root_certificates)
        options = list(channel_options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._stub = sync_stub(self._channel)

    def generate(self, prompt: str | Sequence[int], **options: Unpack[GenerateOptions]) -> ResponseStream:
        """Start generating; returns the stream of chunks (see ``GenerateOptions`` for the options)."""
        options = with_request_id(options)
        request = build_generate_request(prompt, options)
        deadline = Deadline.after(options.get("timeout", self._timeout))
        return ResponseStream(self._stub, request, deadline, self._retry, self._metadata)

    def complete(self, prompt: str | Sequence[int], **options: Unpack[GenerateOptions]) -> Completion:
        """Generate and wait for the whole result."""
        with self.generate(prompt, **options) as stream:
            collector = CompletionCollector(stream.request_id)
            for chunk in stream:
                collector.add(chunk)
        return collector.result()

    def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """Abort a request in flight; ``False`` if the server did not know it."""
        reply = self._unary(self._stub.Abort, pb.AbortRequest(request_id=request_id), timeout, request_id)
        return bool(reply.aborted)

    def health(self, *, timeout: float | None = None) -> HealthStatus:
        return HealthStatus.from_proto(self._unary(self._stub.Health, pb.HealthRequest(), timeout))

    def cluster_status(self, *, timeout: float | None = None) -> ClusterStatus:
        return ClusterStatus.from_proto(self._unary(self._stub.ClusterStatus, pb.ClusterStatusRequest(), timeout))

    def set_policy(
        self, changes: Mapping[str, str | int], worker_id: str | None = None, *, timeout: float | None = None
    ) -> PolicyUpdate:
        """Admin: change scheduling policies at run time; returns the changed workers' policies.

        ``changes`` maps policy keys to values, e.g. ``{"queue": "sjf", "sched_batch": 128}``
        (prefill keys: queue, chunking, chunk_size, selection, sched_batch; decode keys:
        admission.policy and its parameters, preemption.order, preemption.mode, preemption.profile).
        ``worker_id`` is one worker's id, ``"decode"`` for every decode worker, or ``None`` for every
        prefill worker. Raises ``NotFound`` for an unknown worker
        and ``InvalidArgument`` (``field`` = the key) for a bad key or value, or a key of the
        other role.
        """
        request = build_set_policy_request(changes, worker_id)
        return PolicyUpdate.from_proto(self._unary(self._stub.SetPolicy, request, timeout))

    def flip(self, worker_id: str, role: str, *, timeout: float | None = None) -> str:
        """Admin: flip ``worker_id`` to ``role`` ("prefill" or "decode"). It is drained first (no new requests;
        what it holds finishes), then serves in its new role; returns once that has started (``cluster_status()``
        shows the progress: ``lifecycle``, ``flips``). Raises ``NotFound`` for an unknown worker,
        ``InvalidArgument`` for a bad role and ``FailedPrecondition`` when it cannot be done now (the reason)."""
        request = pb.FlipRequest(worker_id=worker_id, role=role)
        return self._unary(self._stub.Flip, request, timeout).message

    def scale(
        self, prefill: int | None = None, decode: int | None = None, *, timeout: float | None = None
    ) -> list[str]:
        """Admin: add or remove workers until each given role has that many (removals drain first); returns
        what was started, one line each. Raises ``FailedPrecondition`` for a count below the minimum."""
        request = pb.ScaleRequest(prefill=prefill, decode=decode)
        return list(self._unary(self._stub.Scale, request, timeout).actions)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TetriServeClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _unary(
        self,
        method: UnaryCall[_Req, _Resp],
        request: _Req,
        timeout: float | None,
        request_id: str | None = None,
    ) -> _Resp:
        deadline = Deadline.after(timeout if timeout is not None else self._timeout)
        failed = 0
        while True:
            try:
                return method(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.RpcError as err:
                failed += 1
                delay = retry_delay(self._retry, err, failed, deadline, got_response=False)
                if delay is None:
                    raise from_rpc_error(err, request_id) from None
                time.sleep(delay)
