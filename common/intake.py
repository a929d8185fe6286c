"""A front door's requests to a worker over ZeroMQ: submit one, abort one (``docs/design/ownership.md``).

Tokens reach the front door over ZeroMQ (``common/outbox.py``) because a Ray call costs several times a ZeroMQ
message on both sides. The calls the other way, one ``submit`` per request and an ``abort`` per worker when a
request ends early, go over ZeroMQ too. Over Ray they lag a burst: with 300 requests at once the GlobalScheduler
places 186 of them by 1 s and the prefill worker has been handed 11, and 34 by 1.5 s; over ZeroMQ all 300 are at
the prefill worker by 1.5 s (``python benchmarks/diagnostics/burst_spans.py --num-prompts 300 --seed 1``, tracing
on; the Ray side measured on ed4d9a8). The sockets:

    front door: one ROUTER socket per process (``WorkerStreams``), beside its stream socket
    worker:     one DEALER per front door's subscription, connected to that ROUTER under the routing id the
                front door's ``attach_intake`` call gave it; it lives as long as the subscription

The routing id names the worker and a random token the front door draws per subscription: it travels only in
that (authenticated) Ray call, so another peer cannot take a worker's messages. A worker of a release without
``attach_intake`` stays on Ray. The ROUTER is
``ROUTER_MANDATORY``: a message to a routing id with no connection (the worker has not connected yet, or its
subscription ended) fails at once, and the front door makes that call over Ray instead. A message sent to a
worker that dies before it reads it is lost with the worker's other requests: its subscription fails and the
front door places them again (``frontdoor/worker_streams.py``).

Messages are msgpack, ``[INTAKE_VERSION, kind, ...]``, and decode into typed ``Submit`` / ``Abort``; a message
that is malformed or of another version is a ``ValueError``, which the worker logs and drops.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from typing import Any

import msgpack

from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestEvent, RequestState, SamplingSpec

logger = logging.getLogger(__name__)

INTAKE_VERSION = 1


class IntakeKind(enum.IntEnum):
    SUBMIT = 1
    ABORT = 2


@dataclass(frozen=True)
class Submit:
    """Take ``request``; its chunks go to the subscription's front door."""

    request: Request


@dataclass(frozen=True)
class Abort:
    """Abort ``request_id`` (``attempt``: only that attempt; None: whichever is here)."""

    request_id: str
    attempt: int | None = None


IntakeMessage = Submit | Abort
_SAMPLING = tuple(f.name for f in fields(SamplingSpec))


def encode(message: IntakeMessage) -> bytes:
    if isinstance(message, Submit):
        body: list[Any] = [IntakeKind.SUBMIT, request_row(message.request)]
    else:
        body = [IntakeKind.ABORT, message.request_id, message.attempt]
    data: bytes = msgpack.packb([INTAKE_VERSION, *body])
    return data


def decode(data: bytes) -> IntakeMessage:
    """The message in ``data``; ValueError when it is not one this side speaks."""
    try:
        version, kind, *body = msgpack.unpackb(data)
        if version != INTAKE_VERSION:
            raise ValueError(f"intake message of version {version}; this side speaks {INTAKE_VERSION}")
        if kind == IntakeKind.SUBMIT:
            (row,) = body
            return Submit(request_from_row(row))
        if kind == IntakeKind.ABORT:
            request_id, attempt = body
            if not isinstance(request_id, str) or not (attempt is None or isinstance(attempt, int)):
                raise ValueError("an abort names a request id and an attempt")
            return Abort(request_id, attempt)
        raise ValueError(f"unknown intake message kind {kind!r}")
    except ValueError:
        raise
    except Exception as exc:  # msgpack's errors, a wrong shape, a field of the wrong type
        raise ValueError(f"malformed intake message: {type(exc).__name__}: {exc}") from None


def request_row(req: Request) -> list[Any]:
    """``req`` as msgpack's plain values (``request_from_row`` reads it back); the handoff channel's too."""
    return [
        req.request_id,
        req.prompt_token_ids,
        {name: getattr(req.sampling, name) for name in _SAMPLING},
        astuple(req.slo),
        req.priority,
        req.arrival_time,
        None if req.length_estimate is None else req.length_estimate.to_dict(),
        req.prefill_worker,
        req.decode_worker,
        req.finish_reason,
        [[int(ev.state), ev.at, ev.detail] for ev in req.events],
        req.attempt,
        req.resume,
        req.trace,
    ]


def request_from_row(row: list[Any]) -> Request:
    """The request ``request_row`` wrote; an exception of msgpack's values of a wrong shape or type."""
    return _request(*row)


def _request(
    request_id: str,
    prompt: list[int],
    sampling: dict[str, Any],
    slo: list[float | None],
    priority: int,
    arrival_time: float,
    estimate: dict[str, Any] | None,
    prefill_worker: str | None,
    decode_worker: str | None,
    finish_reason: str | None,
    events: list[list[Any]],
    attempt: int,
    resume: list[int],
    trace: str | None,
) -> Request:
    spec = {k: _tuples(v) for k, v in sampling.items() if k in _SAMPLING}
    return Request(
        request_id,
        tuple(prompt),
        SamplingSpec(**spec),
        SLO(*slo),
        priority,
        arrival_time,
        None if estimate is None else LengthEstimate.from_dict(estimate),
        prefill_worker,
        decode_worker,
        finish_reason,
        [RequestEvent(RequestState(state), at, detail) for state, at, detail in events],
        attempt,
        tuple(resume),
        trace,
    )


def _tuples(value: Any) -> Any:
    """msgpack's lists back as the tuples the dataclasses hold (``logit_bias``: pairs in a tuple)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


async def serve_intake(address: str, routing_id: bytes, deliver: Callable[[IntakeMessage], None]) -> None:
    """The worker's side: connect a DEALER to the front door's ROUTER at ``address`` under ``routing_id`` and
    hand every message to ``deliver`` (on this event loop) until cancelled."""
    import zmq
    import zmq.asyncio

    socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.ROUTING_ID, routing_id)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    try:
        while True:
            data = await socket.recv()
            try:
                message = decode(data)
            except ValueError as exc:
                logger.warning("intake from %s: a message was dropped: %s", address, exc)
                continue
            try:
                deliver(message)
            except Exception:  # one request's failure must not close the channel of every other
                logger.exception("intake from %s: %s failed", address, type(message).__name__)
    finally:
        socket.close()


class IntakeRouter:
    """The front door's side: one ROUTER socket that sends to any worker whose DEALER is connected to it."""

    def __init__(self, host: str) -> None:
        import zmq

        self._zmq = zmq
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to no connection fails instead of vanishing
        self._socket.setsockopt(zmq.SNDHWM, 0)  # no bound: a busy worker gets a longer queue, never a drop
        self._socket.setsockopt(zmq.RCVHWM, 1)  # workers send nothing on it; whatever comes is not kept
        self._socket.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"

    def send(self, routing_id: bytes, message: IntakeMessage) -> bool:
        """Send ``message`` to the worker connected under ``routing_id``; False if none is (use Ray)."""
        try:
            self._socket.send_multipart([routing_id, encode(message)], self._zmq.NOBLOCK)
        except self._zmq.ZMQError:
            return False
        return True

    def close(self) -> None:
        self._socket.close()
