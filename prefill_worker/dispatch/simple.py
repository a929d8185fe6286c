"""Baseline dispatchers for experiments (TetriInfer Fig. 19): random and round-robin over accepting workers."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from common.load import DecodeLoad
from prefill_worker.dispatch.base import DispatchParams, accepting
from prefill_worker.views import ReqView


class RandomChoice:
    name: ClassVar[str] = "random"

    def __init__(self, params: DispatchParams) -> None:
        self.params = params

    def choose(self, req: ReqView, loads: Sequence[DecodeLoad], rng: random.Random) -> str | None:
        candidates = accepting(loads)
        return rng.choice(candidates).worker_id if candidates else None


class RoundRobin:
    name: ClassVar[str] = "round-robin"

    def __init__(self, params: DispatchParams) -> None:
        self.params = params
        self._next = 0

    def choose(self, req: ReqView, loads: Sequence[DecodeLoad], rng: random.Random) -> str | None:
        candidates = accepting(loads)
        if not candidates:
            return None
        pick = candidates[self._next % len(candidates)]
        self._next += 1
        return pick.worker_id
