"""The messaging layer for everything that crosses processes beside Ray: the front door's intake, the workers'
token streams and the handoff (``docs/design/ownership.md``). Ray stays for actor lifecycle, placement and
administration; a message per request or per engine step goes here, because a Ray call costs several times a
ZeroMQ message on both sides (``benchmarks/diagnostics/handoff_call.py``, ``benchmarks/diagnostics/stream_channel.py``).

**Messages.** A message type is a frozen dataclass registered once, with its kind number and the method it calls
on the receiver, by ``@message(kind, call="take")``; its fields are that method's arguments, in order, and
``invoke(target, message)`` makes the call. Adding a message is writing its dataclass and the method it names.

    frame = msgpack [WIRE_VERSION, kind, call id, field₁, field₂, ...]

Fields travel in declaration order, each packed by the codec its annotation names (``str``, ``int``,
``float``, ``bool``, ``X | None``, ``tuple[int, ...]``, ``Request`` as its row, ``LengthEstimate`` as its dict,
``tuple[StreamChunk, ...]`` as rows packed in one pass: the token streams are the per-token hot path). The call id
is 0 for a one-way message; a request's is a positive number, and the receiver answers it with a reply frame
``[WIRE_VERSION, 0, call id, value, error]``. Decoding checks the version, the kind (against the kinds the
receiving socket takes), the number of fields and each field's type, and raises ``ValueError`` for anything else,
so a socket logs and drops a malformed frame without a branch of its own.

**Sockets**, one shape for every channel::

    Endpoint  a ROUTER bound on a host. Takes messages from peers whose routing id begins with its token (when
              it has one: the token travels only in an authenticated Ray call), hands each to ``handle``, awaits
              what that returns and answers a request with it; ``send`` reaches a connected peer by routing id
              (``ROUTER_MANDATORY``: False at once when no such peer is connected).
    Link      a DEALER connected to an Endpoint under a routing id: ``send`` (one-way, in order with every other
              message of the link), ``call`` (request and reply, liveness built in: a ``probe`` every
              ``LIVENESS_S`` while it waits, which raises once the peer is dead and fails the link; an answer
              timeout for a peer that lives and does not answer), and what the endpoint sends it goes to
              ``on_message``.
    Sender    a DEALER for a thread without an event loop (a decode engine's thread sending its step's tokens):
              ``send`` only, never blocking.

Who binds and who connects::

    intake     front door: Endpoint (no token; routes drawn per subscription)  ◀─ worker: Link, on_message
    streams    front door: the same Endpoint                                   ◀─ worker: Sender
    handoff    decode worker: Endpoint (token)                                 ◀─ prefill worker: Link, calls

No queue is bounded (high-water marks 0): a busy peer gets a longer queue, never a drop, and a sender never
blocks its event loop or its engine thread.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import astuple, dataclass, fields, is_dataclass
from typing import Generic, Protocol, TypeVar

import msgpack
import zmq
import zmq.asyncio

from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestEvent, RequestState, SamplingSpec
from tetriserve.common.stream import StreamChunk, chunk_from_row, chunk_row

logger = logging.getLogger(__name__)

WIRE_VERSION = 4
REPLY = 0  # the kind of a reply frame
LIVENESS_S = 0.5  # a call waiting for its answer asks ``probe`` this often whether the peer still lives
ANSWER_TIMEOUT_S = 30.0  # a call its living peer has not answered in this long fails

T = TypeVar("T")
M = TypeVar("M")  # the messages a socket takes


@dataclass(frozen=True)
class _FieldCodec:
    pack: Callable[[object], object]
    unpack: Callable[[object], object]  # raises (TypeError, ValueError, ...) for a value of the wrong shape


@dataclass(frozen=True)
class _Plan:
    kind: int
    cls: type
    call: str | None
    names: tuple[str, ...]
    codecs: tuple[_FieldCodec, ...]


_BY_KIND: dict[int, _Plan] = {}
_BY_CLASS: dict[type, _Plan] = {}


def message(kind: int, call: str | None = None) -> Callable[[type[T]], type[T]]:
    """Register a frozen dataclass as the message of ``kind`` (unique over every channel, > 0); ``call``: the
    receiver's method it calls with its fields (``invoke``)."""

    def register(cls: type[T]) -> type[T]:
        if kind in _BY_KIND:
            raise ValueError(f"wire kind {kind} is taken by {_BY_KIND[kind].cls.__name__}")
        if kind <= REPLY:
            raise ValueError(f"wire kind {kind} is not a message kind (> {REPLY})")
        if not is_dataclass(cls):
            raise TypeError(f"a wire message is a dataclass; {cls.__name__} is not")
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in fields(cls))
        plan = _Plan(kind, cls, call, names, tuple(_codec(hints[n]) for n in names))
        _BY_KIND[kind] = _BY_CLASS[cls] = plan
        return cls

    return register


def kind_of(cls: type) -> int:
    return _BY_CLASS[cls].kind


def invoke(target: object, msg: object) -> object:
    """Call the method ``msg``'s type names on ``target`` with its fields; what it returns."""
    plan = _BY_CLASS[type(msg)]
    if plan.call is None:
        raise ValueError(f"a {plan.cls.__name__} calls nothing")
    result: object = getattr(target, plan.call)(*(getattr(msg, n) for n in plan.names))
    return result


def encode(msg: object, call: int = 0) -> bytes:
    plan = _BY_CLASS[type(msg)]
    body = [c.pack(getattr(msg, n)) for n, c in zip(plan.names, plan.codecs, strict=True)]
    data: bytes = msgpack.packb([WIRE_VERSION, plan.kind, call, *body])
    return data


def decode(data: bytes, expect: tuple[type[M], ...]) -> M:
    """The message in ``data``, one of the types ``expect``; ValueError when it is not one this side takes."""
    _, msg = _read(data, expect)
    if isinstance(msg, _Reply):
        raise ValueError("a reply where a message was expected")
    return msg


@dataclass(frozen=True)
class _Reply:
    value: object
    error: str | None


def _encode_reply(call: int, value: object, error: str | None) -> bytes:
    data: bytes = msgpack.packb([WIRE_VERSION, REPLY, call, value, error])
    return data


def _read(data: bytes, expect: tuple[type[M], ...]) -> tuple[int, M | _Reply]:
    """(call id, message or ``_Reply``); ValueError for a frame this side does not take."""
    try:
        frame = msgpack.unpackb(data)
    except Exception as exc:
        raise ValueError(f"malformed message: {type(exc).__name__}: {exc}") from None
    if not isinstance(frame, list) or len(frame) < 3:
        raise ValueError("malformed message: not [version, kind, call, ...]")
    version, kind, call, *body = frame
    if version != WIRE_VERSION:
        raise ValueError(f"message of wire version {version}; this side speaks {WIRE_VERSION}")
    if not isinstance(call, int) or isinstance(call, bool) or call < 0:
        raise ValueError(f"malformed message: call id {call!r}")
    if kind == REPLY:
        if len(body) != 2 or not (body[1] is None or isinstance(body[1], str)) or call == 0:
            raise ValueError("malformed reply")
        return call, _Reply(body[0], body[1])
    plan = _BY_KIND.get(kind) if isinstance(kind, int) else None
    if plan is None or plan.cls not in expect:
        raise ValueError(f"unknown message kind {kind!r} on this channel")
    if len(body) != len(plan.names):
        raise ValueError(f"a {plan.cls.__name__} has {len(plan.names)} fields, this one {len(body)}")
    values = {}
    for name, codec, raw in zip(plan.names, plan.codecs, body, strict=True):
        try:
            values[name] = codec.unpack(raw)
        except Exception as exc:  # msgpack's values of a wrong shape or type, a request its own checks refuse
            raise ValueError(f"{plan.cls.__name__}.{name}: {type(exc).__name__}: {exc}") from None
    try:
        msg = plan.cls(**values)
    except Exception as exc:
        raise ValueError(f"{plan.cls.__name__}: {type(exc).__name__}: {exc}") from None
    if not isinstance(msg, expect):  # it is (``plan.cls in expect``); this tells the type checker so
        raise ValueError(f"unknown message kind {kind!r} on this channel")
    return call, msg


# -- sockets ----------------------------------------------------------------------------------------------


class _Options(Protocol):
    def setsockopt(self, option: int, optval: int, /) -> None: ...


def _unbounded(socket: _Options) -> None:
    """No high-water marks (a busy peer gets a longer queue, never a drop) and no lingering at close."""
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)


def _socket(kind: int) -> zmq.asyncio.Socket:
    socket = zmq.asyncio.Context.instance().socket(kind)
    _unbounded(socket)
    return socket


def _send_now(socket: zmq.asyncio.Socket, frames: list[bytes]) -> bool:
    """Send without waiting: the asyncio socket's own non-blocking send (it then wakes a receive waiting on the
    same socket, which a send beside it would not); False when ZeroMQ refuses it (no such peer, closed)."""
    sent = socket.send_multipart(frames, zmq.NOBLOCK)
    assert isinstance(sent, asyncio.Future) and sent.done()  # zmq.asyncio's, settled at once without waiting
    return sent.exception() is None  # asking for the exception also marks it seen


class PeerError(RuntimeError):
    """The peer's method raised (its message, as a Ray call would re-raise it); or it did not answer a call."""


class Endpoint(Generic[M]):
    """A bound ROUTER that peers' links connect to (see the module's docstring)."""

    def __init__(self, host: str, name: str, accepts: tuple[type[M], ...] = (), token: bytes | None = None) -> None:
        self.name, self.token, self._accepts = name, token, accepts
        self._socket = _socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to no connection fails instead of vanishing
        self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"
        self._answering: set[asyncio.Task[None]] = set()

    def send(self, route: bytes, msg: object) -> bool:
        """Send ``msg`` to the peer connected under ``route``; False when none is."""
        return _send_now(self._socket, [route, encode(msg)])

    async def serve(self, handle: Callable[[M], object]) -> None:
        """Until cancelled: every message from a peer that knows the token goes to ``handle`` on this event loop
        (it returns None, a value, or an awaitable of one); an awaitable is awaited off the receive loop, and a
        request is answered with the result. A receive that fails (a socket hiccup) is logged and the loop goes
        on: one bad moment must not end every stream of a front door."""
        try:
            while True:
                try:
                    frames = await self._socket.recv_multipart()
                except zmq.ZMQError as exc:
                    if self._socket.closed:
                        return
                    logger.exception("%s: a receive failed (%s); going on", self.name, exc)
                    await asyncio.sleep(0.01)
                    continue
                if len(frames) != 2:
                    logger.warning("%s: a message of %d frames was dropped", self.name, len(frames) - 1)
                    continue
                route, data = frames
                if self.token is not None and not route.startswith(self.token):
                    logger.warning("%s: a message from a peer without the token was dropped", self.name)
                    continue
                try:
                    call, msg = _read(data, self._accepts)
                    if isinstance(msg, _Reply):
                        raise ValueError("an endpoint takes no replies")
                except ValueError as exc:
                    logger.warning("%s: a message was dropped: %s", self.name, exc)
                    continue
                try:
                    result = handle(msg)
                except Exception as exc:  # one request's failure must not close the channel of every other
                    logger.exception("%s: %s failed", self.name, type(msg).__name__)
                    self._reply(route, call, None, exc)
                    continue
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(self._answer(route, call, msg, result))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                else:
                    self._reply(route, call, result, None)
        finally:
            for task in self._answering:
                task.cancel()
            self._socket.close()

    async def _answer(self, route: bytes, call: int, msg: object, answer: Awaitable[object]) -> None:
        try:
            value, error = await answer, None
        except Exception as exc:  # the receiver's own error, raised in the caller as a Ray call's would be
            logger.exception("%s: %s failed", self.name, type(msg).__name__)
            value, error = None, exc
        self._reply(route, call, value, error)

    def _reply(self, route: bytes, call: int, value: object, error: BaseException | None) -> None:
        if call:
            text = None if error is None else f"{type(error).__name__}: {error}"
            if not _send_now(self._socket, [route, _encode_reply(call, value, text)]):  # the caller has gone
                logger.debug("%s: the answer to call %d found no caller", self.name, call)

    def close(self) -> None:
        self._socket.close()


class Link(Generic[M]):
    """A DEALER connected to the endpoint at ``address`` under ``route`` (see the module's docstring).
    ``probe()``: raises once the peer is dead (a Ray call on its actor); ``on_message``: what the endpoint sends
    this side, of the types ``accepts``."""

    def __init__(
        self,
        address: str,
        route: bytes,
        name: str,
        probe: Callable[[], Awaitable[object]] | None = None,
        accepts: tuple[type[M], ...] = (),
        on_message: Callable[[M], object] | None = None,
    ) -> None:
        self.address, self.name = address, name
        self._probe, self._accepts, self._on_message = probe, accepts, on_message
        self._socket = _socket(zmq.DEALER)
        self._socket.setsockopt(zmq.ROUTING_ID, route)
        self._socket.connect(address)
        self._calls = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[_Reply]] = {}
        self._failure: BaseException | None = None
        self._closed = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def send(self, msg: object) -> None:
        """Queue a one-way message (in order with every other of this link); dropped once the link is closed."""
        if not self._closed:
            _send_now(self._socket, [encode(msg)])

    async def call(self, msg: object) -> object:
        """The peer's answer to ``msg``: the value its method returned; its error, or no answer in
        ``ANSWER_TIMEOUT_S``, as ``PeerError``; the probe's error once the probe finds the peer dead (the link is
        failed then: every other waiting call gets it too, and so does every later one)."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            if self._probe is not None:
                await self._probe()  # a dead peer: its death, as a Ray call on it would raise
            raise PeerError(f"the link to {self.address} is closed")
        call = next(self._calls)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Reply] = loop.create_future()
        self._waiting[call] = future
        deadline = loop.time() + ANSWER_TIMEOUT_S
        try:
            if not _send_now(self._socket, [encode(msg, call)]):
                raise PeerError(f"the link to {self.address} refused a {type(msg).__name__}")
            while True:
                done, _ = await asyncio.wait([future], timeout=LIVENESS_S)
                if done:
                    break
                if self._probe is not None:
                    try:
                        await self._probe()
                    except Exception as exc:
                        self.fail(exc)
                        continue
                if loop.time() >= deadline:
                    raise PeerError(f"{self.address} did not answer a {type(msg).__name__} in {ANSWER_TIMEOUT_S:g} s")
            reply = future.result()
        finally:
            self._waiting.pop(call, None)
        if reply.error is not None:
            raise PeerError(reply.error)
        return reply.value

    def fail(self, exc: BaseException) -> None:
        """The peer's life is over: every waiting call raises ``exc``, and so does every later one."""
        if self._failure is None:
            self._failure = exc
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self.close()

    def close(self) -> None:
        """No more messages; a call still waiting ends when its probe finds the peer dead, or at its timeout."""
        if not self._closed:
            self._closed = True
            self._reader.cancel()
            self._socket.close()

    async def _read(self) -> None:
        while True:
            data = await self._socket.recv()
            try:
                call, msg = _read(data, self._accepts)
            except ValueError as exc:
                logger.warning("%s: a message was dropped: %s", self.name, exc)
                continue
            if isinstance(msg, _Reply):
                future = self._waiting.get(call)
                if future is not None and not future.done():
                    future.set_result(msg)
            elif self._on_message is not None:
                try:
                    self._on_message(msg)
                except Exception:  # one request's failure must not close the channel of every other
                    logger.exception("%s: %s failed", self.name, type(msg).__name__)


class Sender:
    """A DEALER connected to the endpoint at ``address``, for one thread at a time and no event loop: ``send``
    never blocks (ZeroMQ queues what the endpoint has not read yet)."""

    def __init__(self, address: str) -> None:
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        _unbounded(self._socket)
        self._socket.connect(address)

    def send(self, msg: object) -> None:
        self._socket.send(encode(msg), zmq.NOBLOCK)

    def close(self) -> None:
        self._socket.close()


# -- field codecs -----------------------------------------------------------------------------------------
# Each packs a field's value into msgpack's plain values and checks what it unpacks: a value of the wrong shape
# or type raises (TypeError, ValueError, ...), which ``_read`` reports as the field's.


def _expect(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _checked(kind: type) -> _FieldCodec:
    return _FieldCodec(lambda v: v, lambda v: _expect(v, kind))


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _optional(inner: _FieldCodec) -> _FieldCodec:
    return _FieldCodec(lambda v: None if v is None else inner.pack(v), lambda v: None if v is None else inner.unpack(v))


def _ints(value: object) -> tuple[int, ...]:
    items = tuple(_expect(value, list))
    if not all(type(v) is int for v in items):  # not isinstance: a bool is no token id
        raise TypeError("expected a list of integers")
    return items


def _int_tuple() -> _FieldCodec:
    return _FieldCodec(lambda v: list(_expect(v, tuple)), _ints)


def _chunks() -> _FieldCodec:
    def unpack(rows: object) -> tuple[StreamChunk, ...]:
        return tuple(chunk_from_row(_expect(row, list)) for row in _expect(rows, list))

    return _FieldCodec(lambda chunks: [chunk_row(c) for c in _expect(chunks, tuple)], unpack)


def _codec(annotation: object) -> _FieldCodec:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args == (StreamChunk, ...):
        return _chunks()
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(_codec(inner))
    if origin is tuple and args == (int, ...):
        return _int_tuple()
    if annotation is Request:
        return _FieldCodec(lambda r: request_row(_expect(r, Request)), _request)
    if annotation is LengthEstimate:
        return _FieldCodec(
            lambda e: _expect(e, LengthEstimate).to_dict(), lambda d: LengthEstimate.from_dict(_expect(d, dict))
        )
    if annotation is float:
        return _FieldCodec(_as_float, _as_float)
    if annotation in (str, int, bool):
        assert isinstance(annotation, type)
        return _checked(annotation)
    raise TypeError(f"no wire codec for {annotation!r}")


# -- the request ------------------------------------------------------------------------------------------

_SAMPLING = tuple(f.name for f in fields(SamplingSpec))
_ROW = 14  # a request row's fields
_sampling_spec: Callable[..., SamplingSpec] = SamplingSpec  # built from a row's checked mapping


def request_row(req: Request) -> list[object]:
    """``req`` as msgpack's plain values."""
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


def _request(row: object) -> Request:
    """The request of a ``request_row``; each field checked (the request's own checks run as it is built)."""
    values = _expect(row, list)
    if len(values) != _ROW:
        raise ValueError(f"a request row has {_ROW} fields, this one {len(values)}")
    rid, prompt, sampling, slo, priority, arrival, estimate, prefill, decode_, finish, events, attempt = values[:12]
    resume, trace = values[12:]
    spec = {k: _tuples(v) for k, v in _expect(sampling, dict).items() if k in _SAMPLING}
    slo_fields = [None if v is None else _as_float(v) for v in _expect(slo, list)]
    return Request(
        _expect(rid, str),
        _ints(prompt),
        _sampling_spec(**spec),
        SLO(*slo_fields),
        _expect(priority, int),
        _as_float(arrival),
        None if estimate is None else LengthEstimate.from_dict(_expect(estimate, dict)),
        _optional_str(prefill),
        _optional_str(decode_),
        _optional_str(finish),
        [_event(_expect(ev, list)) for ev in _expect(events, list)],
        _expect(attempt, int),
        _ints(resume),
        _optional_str(trace),
    )


def _event(values: list[object]) -> RequestEvent:
    state, at, detail = values
    return RequestEvent(RequestState(_expect(state, int)), _as_float(at), _expect(detail, str))


def _optional_str(value: object) -> str | None:
    return None if value is None else _expect(value, str)


def _tuples(value: object) -> object:
    """msgpack's lists back as the tuples the dataclasses hold (``logit_bias``: pairs in a tuple)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
