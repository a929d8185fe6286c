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

Messages are ``Submit`` and ``Abort`` in the wire codec (``common/wire.py``); a message that is malformed, of
another version or of another channel is a ``ValueError``, which the worker logs and drops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from tetriserve.common import wire
from tetriserve.common.request import Request

logger = logging.getLogger(__name__)


@wire.wire_message(1)
@dataclass(frozen=True)
class Submit:
    """Take ``request``; its chunks go to the subscription's front door."""

    request: Request


@wire.wire_message(2)
@dataclass(frozen=True)
class Abort:
    """Abort ``request_id`` (``attempt``: only that attempt; None: whichever is here)."""

    request_id: str
    attempt: int | None = None


IntakeMessage = Submit | Abort
INTAKE_MESSAGES = (Submit, Abort)


def encode(message: IntakeMessage) -> bytes:
    return wire.encode(message)


def decode(data: bytes) -> IntakeMessage:
    """The message in ``data``; ValueError when it is not one this side speaks."""
    message: IntakeMessage = wire.decode(data, INTAKE_MESSAGES)
    return message


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
