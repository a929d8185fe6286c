"""One codec for the messages that cross processes beside Ray: the front door's intake and the handoff.

    frame = msgpack [WIRE_VERSION, kind, field₁, field₂, ...]

Each message type is a frozen dataclass registered once, with its kind number, by ``@wire_message(kind)``; its
fields travel in declaration order, each packed by the codec its annotation names (``str``, ``int``,
``float``, ``bool``, ``X | None``, ``tuple[int, ...]``, ``Request`` as its row, ``LengthEstimate`` as its dict).
Adding a message is writing its dataclass: ``encode`` and ``decode`` know it from the registry. ``decode``
checks the version, the kind (against the kinds the caller's channel takes, ``expect``), the number of fields
and each field's type, and raises ``ValueError`` for anything else, so a channel logs and drops a malformed
frame without a branch of its own. The token streams (``common/stream.py``) keep a row format of their own:
they are the per-token hot path, and a chunk batch is packed in one pass.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from typing import Any, TypeVar

import msgpack

from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestEvent, RequestState, SamplingSpec

WIRE_VERSION = 2

T = TypeVar("T")


@dataclass(frozen=True)
class _FieldCodec:
    pack: Callable[[Any], Any]
    unpack: Callable[[Any], Any]  # raises (TypeError, ValueError, ...) for a value of the wrong shape


@dataclass(frozen=True)
class _Plan:
    kind: int
    cls: type
    names: tuple[str, ...]
    codecs: tuple[_FieldCodec, ...]


_BY_KIND: dict[int, _Plan] = {}
_BY_CLASS: dict[type, _Plan] = {}


def wire_message(kind: int) -> Callable[[type[T]], type[T]]:
    """Register a frozen dataclass as the message of ``kind`` (unique over every channel)."""

    def register(cls: type[T]) -> type[T]:
        if kind in _BY_KIND:
            raise ValueError(f"wire kind {kind} is taken by {_BY_KIND[kind].cls.__name__}")
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        plan = _Plan(kind, cls, names, tuple(_codec(hints[n]) for n in names))
        _BY_KIND[kind] = _BY_CLASS[cls] = plan
        return cls

    return register


def kind_of(cls: type) -> int:
    return _BY_CLASS[cls].kind


def encode(message: Any) -> bytes:
    plan = _BY_CLASS[type(message)]
    body = [c.pack(getattr(message, n)) for n, c in zip(plan.names, plan.codecs, strict=True)]
    data: bytes = msgpack.packb([WIRE_VERSION, plan.kind, *body])
    return data


def decode(data: bytes, expect: tuple[type, ...]) -> Any:
    """The message in ``data``, one of the types ``expect``; ValueError when it is not one this side takes."""
    try:
        frame = msgpack.unpackb(data)
    except Exception as exc:
        raise ValueError(f"malformed message: {type(exc).__name__}: {exc}") from None
    if not isinstance(frame, list) or len(frame) < 2:
        raise ValueError("malformed message: not [version, kind, ...]")
    version, kind, *body = frame
    if version != WIRE_VERSION:
        raise ValueError(f"message of wire version {version}; this side speaks {WIRE_VERSION}")
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
        return plan.cls(**values)
    except Exception as exc:
        raise ValueError(f"{plan.cls.__name__}: {type(exc).__name__}: {exc}") from None


# -- field codecs -----------------------------------------------------------------------------------------


def _checked(kind: type | tuple[type, ...]) -> _FieldCodec:
    def unpack(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
        return value

    return _FieldCodec(lambda v: v, unpack)


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _optional(inner: _FieldCodec) -> _FieldCodec:
    return _FieldCodec(lambda v: None if v is None else inner.pack(v), lambda v: None if v is None else inner.unpack(v))


def _int_tuple() -> _FieldCodec:
    check = _checked(int)

    def unpack(value: Any) -> tuple[int, ...]:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        return tuple(check.unpack(v) for v in value)

    return _FieldCodec(list, unpack)


def _codec(annotation: Any) -> _FieldCodec:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(_codec(inner))
    if origin is tuple and args == (int, ...):
        return _int_tuple()
    if annotation is Request:
        return _FieldCodec(request_row, lambda row: _request(*row))
    if annotation is LengthEstimate:
        return _FieldCodec(lambda e: e.to_dict(), LengthEstimate.from_dict)
    if annotation is float:
        return _FieldCodec(float, _as_float)
    if annotation in (str, int, bool):
        return _checked(annotation)
    raise TypeError(f"no wire codec for {annotation!r}")


# -- the request ------------------------------------------------------------------------------------------

_SAMPLING = tuple(f.name for f in fields(SamplingSpec))


def request_row(req: Request) -> list[Any]:
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
    if not isinstance(request_id, str):
        raise TypeError("a request id is a string")
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
