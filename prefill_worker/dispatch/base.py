"""The dispatch policy seam: ``choose(req, decode_loads, rng) -> worker_id | None``.

``None`` means no decode worker is accepting work (backpressure, not an error).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.views import ReqView


@dataclass(frozen=True)
class DispatchParams:
    heavy_threshold_tokens: int = 128


class DispatchPolicy(Protocol):
    name: ClassVar[str]

    def __init__(self, params: DispatchParams) -> None: ...

    def choose(self, req: ReqView, loads: Sequence[DecodeLoad], rng: random.Random) -> str | None: ...


def accepting(loads: Sequence[DecodeLoad]) -> list[DecodeLoad]:
    return sorted((ld for ld in loads if ld.accepting), key=lambda ld: ld.worker_id)


class AcceptingDispatcher:
    """What every dispatcher shares: no accepting worker is ``None`` (backpressure); otherwise ``pick``
    chooses among the accepting workers, given sorted by id."""

    name: ClassVar[str]

    def __init__(self, params: DispatchParams) -> None:
        self.params = params

    def choose(self, req: ReqView, loads: Sequence[DecodeLoad], rng: random.Random) -> str | None:
        candidates = accepting(loads)
        return self.pick(req, candidates, rng).worker_id if candidates else None

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        raise NotImplementedError


def account(load: DecodeLoad, req: ReqView, heavy_threshold_tokens: int) -> DecodeLoad:
    """``load`` as it will be once ``req`` is on that worker: what a dispatcher assumes until the next broadcast,
    so a burst between broadcasts does not herd onto one worker. Free KV is debited by the request's
    predicted upper range and may go below zero (overcommitted)."""
    heavy = req.is_heavy(heavy_threshold_tokens)
    return replace(
        load,
        free_kv_blocks=load.free_kv_blocks - req.kv_blocks_upper(load.block_size),
        queued=load.queued + 1,
        heavy=load.heavy + heavy,
        light=load.light + (not heavy),
        remaining_tokens=load.remaining_tokens + req.expected_output(),
    )
