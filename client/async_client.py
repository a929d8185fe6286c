"""asyncio gRPC client of the tetriserve front door (``grpc.aio``).

Example::

    async with AsyncTetriServeClient("localhost:50051") as client:
        async with client.generate("Hello", max_tokens=32, timeout=30) as stream:
            async for chunk in stream:
                print(chunk.text, end="", flush=True)
        print((await client.complete([1, 2, 3], max_tokens=8)).token_ids)

Same semantics as the sync client: ``AsyncResponseStream`` exposes
``request_id`` at once; ``cancel()``, ``aclose()`` or leaving its ``async with``
block stops the call and the server aborts the request; ``UNAVAILABLE`` is
retried only before the first response. The channel is created on first use,
inside the running event loop. ``api_key``, ``tls`` and ``root_certificates`` as for
``TetriServeClient`` (``client/credentials.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import grpc
import grpc.aio

from tetriserve.client.credentials import Metadata, auth_metadata, channel_credentials, resolve_api_key
from tetriserve.client.errors import from_rpc_error
from tetriserve.client.options import GenerateOptions, build_generate_request, build_set_policy_request, with_request_id
from tetriserve.client.results import Chunk, ClusterStatus, Completion, CompletionCollector, HealthStatus, PolicyUpdate
from tetriserve.client.retry import Deadline, RetryPolicy, retry_delay
from tetriserve.client.stubs import AsyncGenerateCall, AsyncStub, UnaryCall, async_stub
from tetriserve.protos import tetriserve_pb2 as pb

logger = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class AsyncResponseStream:
    """The chunks of one ``generate`` call; an async iterator and an async context manager."""

    def __init__(
        self,
        stub_factory: Callable[[], AsyncStub],
        request: pb.GenerateRequest,
        deadline: Deadline,
        policy: RetryPolicy,
        metadata: Metadata | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._metadata = metadata
        self._stub_factory = stub_factory
        self._request = request
        self._deadline = deadline
        self._policy = policy
        self._call: AsyncGenerateCall | None = None  # the attempt in progress
        self._cancelled = False
        self._chunks = self._run()

    def __aiter__(self) -> AsyncResponseStream:
        return self

    async def __anext__(self) -> Chunk:
        return await self._chunks.__anext__()

    def cancel(self) -> None:
        """Stop the stream; the server aborts the request."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()
        await self._chunks.aclose()

    async def __aenter__(self) -> AsyncResponseStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[Chunk, None]:
        failed = 0
        got_response = False
        stub = self._stub_factory()
        while not self._cancelled:
            call = stub.Generate(self._request, timeout=self._deadline.remaining(), metadata=self._metadata)
            self._call = call
            try:
                async for msg in call:
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
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._cancelled and (task is None or task.cancelling() == 0):
                    return  # our own cancel() ended the call, not a cancellation of the caller's task
                raise
            finally:
                call.cancel()  # no-op once finished; stops the server when the consumer left early


class AsyncTetriServeClient:
    """asyncio client; use it from one event loop."""

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
        """Arguments as for ``TetriServeClient``; no connection is made until the first call."""
        self.target = target
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._metadata = auth_metadata(resolve_api_key(api_key))
        self._credentials = channel_credentials(credentials, tls, root_certificates)
        self._channel_options = list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: AsyncStub | None = None

    def _get_stub(self) -> AsyncStub:
        if self._stub is None:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._channel_options)
            else:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._channel_options)
            self._stub = async_stub(self._channel)
        return self._stub

    def generate(self, prompt: str | Sequence[int], **options: Unpack[GenerateOptions]) -> AsyncResponseStream:
        """Start generating; returns the async stream of chunks (see ``GenerateOptions``)."""
        options = with_request_id(options)
        request = build_generate_request(prompt, options)
        deadline = Deadline.after(options.get("timeout", self._timeout))
        return AsyncResponseStream(self._get_stub, request, deadline, self._retry, self._metadata)

    async def complete(self, prompt: str | Sequence[int], **options: Unpack[GenerateOptions]) -> Completion:
        """Generate and wait for the whole result."""
        async with self.generate(prompt, **options) as stream:
            collector = CompletionCollector(stream.request_id)
            async for chunk in stream:
                collector.add(chunk)
        return collector.result()

    async def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """Abort a request in flight; ``False`` if the server did not know it."""
        stub = self._get_stub()
        reply = await self._unary(stub.Abort, pb.AbortRequest(request_id=request_id), timeout, request_id)
        return bool(reply.aborted)

    async def health(self, *, timeout: float | None = None) -> HealthStatus:
        reply = await self._unary(self._get_stub().Health, pb.HealthRequest(), timeout)
        return HealthStatus.from_proto(reply)

    async def cluster_status(self, *, timeout: float | None = None) -> ClusterStatus:
        reply = await self._unary(self._get_stub().ClusterStatus, pb.ClusterStatusRequest(), timeout)
        return ClusterStatus.from_proto(reply)

    async def set_policy(
        self, changes: Mapping[str, str | int], worker_id: str | None = None, *, timeout: float | None = None
    ) -> PolicyUpdate:
        """Admin: change scheduling policies at run time (see ``TetriServeClient.set_policy``)."""
        request = build_set_policy_request(changes, worker_id)
        return PolicyUpdate.from_proto(await self._unary(self._get_stub().SetPolicy, request, timeout))

    async def flip(self, worker_id: str, role: str, *, timeout: float | None = None) -> str:
        """Admin: flip a worker to the other role (see ``TetriServeClient.flip``)."""
        request = pb.FlipRequest(worker_id=worker_id, role=role)
        return (await self._unary(self._get_stub().Flip, request, timeout)).message

    async def scale(
        self, prefill: int | None = None, decode: int | None = None, *, timeout: float | None = None
    ) -> list[str]:
        """Admin: add or remove workers (see ``TetriServeClient.scale``)."""
        request = pb.ScaleRequest(prefill=prefill, decode=decode)
        return list((await self._unary(self._get_stub().Scale, request, timeout)).actions)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def __aenter__(self) -> AsyncTetriServeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _unary(
        self,
        method: UnaryCall[_Req, Awaitable[_Resp]],
        request: _Req,
        timeout: float | None,
        request_id: str | None = None,
    ) -> _Resp:
        deadline = Deadline.after(timeout if timeout is not None else self._timeout)
        failed = 0
        while True:
            try:
                return await method(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.RpcError as err:
                failed += 1
                delay = retry_delay(self._retry, err, failed, deadline, got_response=False)
                if delay is None:
                    raise from_rpc_error(err, request_id) from None
                await asyncio.sleep(delay)
