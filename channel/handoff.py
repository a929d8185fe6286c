"""A prefill worker's calls on a decode worker: the handoff (``docs/design/ownership.md``).

Every request a prefill worker hands on makes two or three calls on the decode worker: ``pull_kv`` (a
pipelined handoff's pull of the KV parts as they are parked), ``take`` (the request itself, answered), and
``refine`` (the prediction that was late for the handoff). As a Ray call from one async actor to another, one
costs 850 µs of CPU in the caller and 925 µs in the callee one at a time, 425 and 500 µs eight at a time; over
the channel (``channel/core.py``), 350 and 400 µs, and 75 and 100 µs (``python
benchmarks/diagnostics/handoff_call.py --calls 400 --prompt-tokens 300``). In a burst those calls run beside the
engines on the same cores and in the engines' processes. The sockets:

    decode worker:  one ``Endpoint`` with a token, bound when first asked for (``handoff_address``, one
                    authenticated Ray call, which hands out its address and token)
    prefill worker: one ``Link`` per decode worker's life (``prefill_worker/decode_peers.py``), routing id =
                    token + its own id + a random part (a restarted caller never meets its old connection's)

One link carries all of a prefill worker's messages to that decode worker, in order (a pull before the ``take``
that waits for it, a ``refine`` after it). A ``take`` is a call: while it waits the link asks Ray every
``LIVENESS_S`` whether the decode worker's actor still lives (its ``ping``), so a worker killed with a ``take``
outstanding fails it with Ray's own ``ActorDiedError`` about as soon as a Ray call would have; one that lives and
has not answered in ``ANSWER_TIMEOUT_S`` fails it with ``PeerError``, and the request's attempt ends with a
``retry`` error, as for any handoff that fails. Each message names the decode worker's method it calls; the
worker's actor dispatches them with ``core.invoke``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tetriserve.channel import core
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request


@core.message(11, call="take")
@dataclass(frozen=True)
class Take:
    """Decode ``request`` (its prompt and the tokens ``generated`` so far) for the front door ``subscriber``;
    its KV comes pushed, is pulled ``pull_from`` a prefill endpoint of this host, or (``prefill_here``) is
    computed there; its length estimate travels on it (``Request.length_estimate``). Answered with whether the
    decode worker took it."""

    request: Request
    generated: tuple[int, ...]
    subscriber: str
    pull_from: str | None = None
    prefill_here: bool = False


@core.message(12, call="pull_kv")
@dataclass(frozen=True)
class PullKV:
    """Pull ``key``'s KV from the prefill endpoint ``src`` of this host, part by part as it is published."""

    src: str
    key: str


@core.message(13, call="refine")
@dataclass(frozen=True)
class Refine:
    """The length prediction that was late for the handoff of ``request_id``'s ``attempt``."""

    request_id: str
    attempt: int
    estimate: LengthEstimate


@core.message(14, call="discard")
@dataclass(frozen=True)
class Discard:
    """Drop KV pushed for ``key``: its request will not decode there."""

    key: str


@core.message(15, call="kv_failed")
@dataclass(frozen=True)
class KvFailed:
    """The send of ``key``'s KV failed: the engine's load of it fails now, not at its deadline."""

    key: str
    error: str


HandoffMessage = Take | PullKV | Refine | Discard | KvFailed
HANDOFF_MESSAGES: tuple[type[HandoffMessage], ...] = (Take, PullKV, Refine, Discard, KvFailed)
