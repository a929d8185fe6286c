"""What the clients call on the generated ``TetriServeStub`` (``protos/tetriserve_pb2_grpc.py``), typed.

The generated stub is unannotated: its methods are the channel's multi-callables, built in its constructor.
These protocols declare the calls the clients make, one per RPC, with the request and reply messages of
``protos/tetriserve.proto``; ``sync_stub`` / ``async_stub`` build the stub over a ``grpc`` / ``grpc.aio``
channel and hand it back as one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from tetriserve.client.credentials import Metadata
from tetriserve.protos import tetriserve_pb2 as pb
from tetriserve.protos import tetriserve_pb2_grpc as pb_grpc

_Req = TypeVar("_Req", contravariant=True)
_Resp = TypeVar("_Resp", covariant=True)


class UnaryCall(Protocol[_Req, _Resp]):
    """A unary RPC: one request, one reply (or, on a ``grpc.aio`` channel, an awaitable of it)."""

    def __call__(self, request: _Req, *, timeout: float | None, metadata: Metadata | None) -> _Resp: ...


class GenerateCall(Iterable[pb.GenerateResponse], Protocol):
    """A ``Generate`` call in flight on a blocking channel: its responses, and its cancellation."""

    def cancel(self) -> bool: ...


class AsyncGenerateCall(AsyncIterable[pb.GenerateResponse], Protocol):
    """A ``Generate`` call in flight on a ``grpc.aio`` channel: its responses, and its cancellation."""

    def cancel(self) -> bool: ...


class Stub(Protocol):
    """The stub over a blocking channel."""

    Generate: UnaryCall[pb.GenerateRequest, GenerateCall]
    Abort: UnaryCall[pb.AbortRequest, pb.AbortResponse]
    Health: UnaryCall[pb.HealthRequest, pb.HealthResponse]
    ClusterStatus: UnaryCall[pb.ClusterStatusRequest, pb.ClusterStatusResponse]
    SetPolicy: UnaryCall[pb.SetPolicyRequest, pb.SetPolicyResponse]
    Flip: UnaryCall[pb.FlipRequest, pb.FlipResponse]
    Scale: UnaryCall[pb.ScaleRequest, pb.ScaleResponse]


class AsyncStub(Protocol):
    """The stub over a ``grpc.aio`` channel: unary calls are awaited."""

    Generate: UnaryCall[pb.GenerateRequest, AsyncGenerateCall]
    Abort: UnaryCall[pb.AbortRequest, Awaitable[pb.AbortResponse]]
    Health: UnaryCall[pb.HealthRequest, Awaitable[pb.HealthResponse]]
    ClusterStatus: UnaryCall[pb.ClusterStatusRequest, Awaitable[pb.ClusterStatusResponse]]
    SetPolicy: UnaryCall[pb.SetPolicyRequest, Awaitable[pb.SetPolicyResponse]]
    Flip: UnaryCall[pb.FlipRequest, Awaitable[pb.FlipResponse]]
    Scale: UnaryCall[pb.ScaleRequest, Awaitable[pb.ScaleResponse]]


def sync_stub(channel: object) -> Stub:
    """The generated stub over a blocking ``grpc.Channel``."""
    make: Callable[[object], Stub] = pb_grpc.TetriServeStub
    return make(channel)


def async_stub(channel: object) -> AsyncStub:
    """The generated stub over a ``grpc.aio.Channel``."""
    make: Callable[[object], AsyncStub] = pb_grpc.TetriServeStub
    return make(channel)
