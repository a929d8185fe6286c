"""Baseline dispatchers for experiments (TetriInfer Fig. 19): random and round-robin over accepting workers."""

from __future__ import annotations

import random
from typing import ClassVar

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.dispatch.base import AcceptingDispatcher, DispatchParams
from tetriserve.prefill_worker.views import ReqView


class RandomChoice(AcceptingDispatcher):
    name: ClassVar[str] = "random"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        return rng.choice(candidates)


class RoundRobin(AcceptingDispatcher):
    name: ClassVar[str] = "round-robin"

    def __init__(self, params: DispatchParams) -> None:
        super().__init__(params)
        self._next = 0

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen
