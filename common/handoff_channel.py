"""A prefill worker's calls on a decode worker over ZeroMQ: the handoff (``docs/design/ownership.md``).

Every request a prefill worker hands on makes two or three calls on the decode worker: ``pull_kv`` (a
pipelined handoff's pull of the KV parts as they are parked), ``take`` (the request itself, answered), and
``refine`` (the prediction that was late for the handoff). As a Ray call from one async actor to another, one
costs 850 µs of CPU in the caller and 925 µs in the callee one at a time, 425 and 500 µs eight at a time; over
this link, 350 and 400 µs, and 75 and 100 µs (``python benchmarks/diagnostics/handoff_call.py --calls 400
--prompt-tokens 300``). In a burst those calls run beside the engines on the same cores and in the engines'
processes. So they go over ZeroMQ, as the front door's submits do (``common/intake.py``):

    decode worker: one ROUTER socket, bound when its actor starts (``HandoffServer``); its address and
                   a random token go to a prefill worker in one (authenticated) Ray call, ``handoff_address``
    prefill worker: one DEALER per decode worker's life (``HandoffLink``), routing id = token + its own id

The server takes messages only from routing ids that begin with its token, so another peer cannot hand it
requests. One link carries all of a prefill worker's messages to that decode worker, in order (a pull before
the ``take`` that waits for it, a ``refine`` after it). ``take`` is answered with a ``Reply`` of the same call
number; while it waits, the link asks Ray every ``LIVENESS_S`` whether the decode worker's actor still lives
(``probe``), so a worker killed with a ``take`` outstanding fails it with Ray's own ``ActorDiedError`` about as
soon as a Ray call would have; one that lives and has not answered in ``ANSWER_TIMEOUT_S`` (its server gone, or
a message it could not read) fails it with ``HandoffError``, and the request's attempt ends with a ``retry``
error, as for any handoff that fails. Messages are the typed messages below in the wire codec
(``common/wire.py``); a malformed one, one of another version or channel, or of other than one frame, is logged
and dropped by the server.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tetriserve.common import wire
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request

logger = logging.getLogger(__name__)

LIVENESS_S = 0.5  # an unanswered take asks Ray this often whether the decode worker still lives
ANSWER_TIMEOUT_S = 30.0  # a take its living decode worker has not answered in this long fails


@wire.wire_message(11)
@dataclass(frozen=True)
class Take:
    """``DecodeWorker.take``; answered by a ``Reply`` with the same ``call``."""

    call: int
    request: Request
    generated: tuple[int, ...]
    estimate: LengthEstimate | None
    subscriber: str
    pull_from: str | None = None
    prefill_here: bool = False


@wire.wire_message(12)
@dataclass(frozen=True)
class PullKV:
    src: str
    key: str


@wire.wire_message(13)
@dataclass(frozen=True)
class Refine:
    request_id: str
    attempt: int
    estimate: LengthEstimate


@wire.wire_message(14)
@dataclass(frozen=True)
class Discard:
    key: str


@wire.wire_message(15)
@dataclass(frozen=True)
class KvFailed:
    key: str
    error: str


@wire.wire_message(16)
@dataclass(frozen=True)
class Reply:
    """The answer to ``Take`` number ``call``: taken, or the error the decode worker's ``take`` raised."""

    call: int
    taken: bool
    error: str | None = None


HandoffMessage = Take | PullKV | Refine | Discard | KvFailed | Reply
HANDOFF_MESSAGES = (Take, PullKV, Refine, Discard, KvFailed, Reply)


def encode(message: HandoffMessage) -> bytes:
    return wire.encode(message)


def decode(data: bytes) -> HandoffMessage:
    """The message in ``data``; ValueError when it is not one this side speaks."""
    message: HandoffMessage = wire.decode(data, HANDOFF_MESSAGES)
    return message


class HandoffServer:
    """The decode side: a ROUTER bound on ``host``; ``serve`` hands each message from a peer that knows the
    token to ``handle`` (on this event loop), awaits what it returns (a ``take``, a ``refine``) and answers each
    ``Take`` with that."""

    def __init__(self, host: str) -> None:
        import zmq
        import zmq.asyncio

        self.token = secrets.token_hex(16).encode()
        self._socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"
        self._answering: set[asyncio.Task[None]] = set()

    async def serve(self, handle: Callable[[HandoffMessage], Awaitable[bool] | None]) -> None:
        """Until cancelled. ``handle(message)``: None, or an awaitable (for a ``Take``: of its answer)."""
        try:
            while True:
                frames = await self._socket.recv_multipart()
                if len(frames) != 2:
                    logger.warning("handoff: a message of %d frames was dropped", len(frames) - 1)
                    continue
                route, data = frames
                if not route.startswith(self.token):
                    logger.warning("handoff: a message from a peer without the token was dropped")
                    continue
                try:
                    message = decode(data)
                except ValueError as exc:
                    logger.warning("handoff: a message was dropped: %s", exc)
                    continue
                try:
                    answer = handle(message)
                except Exception:  # one request's failure must not close the channel of every other
                    logger.exception("handoff: %s failed", type(message).__name__)
                    continue
                if answer is not None:
                    task = asyncio.create_task(self._answer(route, message, answer))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
        finally:
            for task in self._answering:
                task.cancel()
            self._socket.close()

    async def _answer(self, route: bytes, message: HandoffMessage, answer: Awaitable[bool]) -> None:
        try:
            taken, error = bool(await answer), None
        except Exception as exc:  # the worker's own error, raised in the caller as a Ray call's would be
            logger.exception("handoff: %s failed", type(message).__name__)
            taken, error = False, f"{type(exc).__name__}: {exc}"
        if isinstance(message, Take):
            await self._socket.send_multipart([route, encode(Reply(message.call, taken, error))])


class HandoffError(RuntimeError):
    """The decode worker's ``take`` raised (its message), as a Ray call would re-raise it; or it did not answer."""


class HandoffLink:
    """The prefill side, for one decode worker's life: a DEALER connected to its server, under a routing id of
    the token, the caller's ``name`` and a random part (a restarted caller never meets its old connection's).
    ``probe()`` is a Ray call on that decode worker's actor that raises once the actor is dead (``ping``)."""

    def __init__(self, address: str, token: bytes, name: str, probe: Callable[[], Awaitable[Any]]) -> None:
        import zmq
        import zmq.asyncio

        self.address = address
        self._probe = probe
        self._socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.ROUTING_ID, b":".join((token, name.encode(), secrets.token_hex(4).encode())))
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)
        self._noblock = zmq.NOBLOCK
        self._calls = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Reply]] = {}
        self._failure: BaseException | None = None
        self._closed = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def send(self, message: HandoffMessage) -> None:
        """Queue a one-way message (sent in order with every other of this link); dropped once it is closed."""
        if not self._closed:
            self._socket.send(encode(message), self._noblock)

    async def take(
        self,
        req: Request,
        generated: tuple[int, ...],
        estimate: LengthEstimate | None,
        subscriber: str,
        pull_from: str | None = None,
        prefill_here: bool = False,
    ) -> bool:
        """``take`` on the decode worker: its answer; its own error, or no answer in ``ANSWER_TIMEOUT_S``, as
        ``HandoffError``; Ray's ``ActorDiedError`` once the probe finds it dead (this link is failed then: every
        other waiting call gets it too)."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise HandoffError(f"the handoff link to {self.address} is closed")
        call = next(self._calls)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiting[call] = future
        deadline = loop.time() + ANSWER_TIMEOUT_S
        try:
            self.send(Take(call, req, generated, estimate, subscriber, pull_from, prefill_here))
            while True:
                done, _ = await asyncio.wait([future], timeout=LIVENESS_S)
                if done:
                    break
                try:
                    await self._probe()
                except Exception as exc:
                    self.fail(exc)
                    continue
                if loop.time() >= deadline:
                    raise HandoffError(f"{self.address} did not answer a take in {ANSWER_TIMEOUT_S:g} s")
            reply = future.result()
        finally:
            self._waiting.pop(call, None)
        if reply.error is not None:
            raise HandoffError(reply.error)
        return reply.taken

    def fail(self, exc: BaseException) -> None:
        """The decode worker's life is over: every waiting ``take`` raises ``exc``, and so does every later one."""
        if self._failure is None:
            self._failure = exc
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self.close()

    def close(self) -> None:
        """No more messages; a ``take`` still waiting ends when its probe finds the actor dead."""
        self._closed = True
        self._reader.cancel()
        self._socket.close()

    async def _read(self) -> None:
        while True:
            data = await self._socket.recv()
            try:
                reply = decode(data)
            except ValueError as exc:
                logger.warning("handoff link to %s: a message was dropped: %s", self.address, exc)
                continue
            if not isinstance(reply, Reply):
                continue
            future = self._waiting.get(reply.call)
            if future is not None and not future.done():
                future.set_result(reply)
