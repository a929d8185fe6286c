"""Interference-aware power-of-two dispatch (TetriInfer §3.3.4).

1. Split decode workers into those whose free KV fits the request's predicted
   upper range (prompt + upper output tokens) and those whose does not.
2. Pick two at random from the first set (from all accepting workers if none fits:
   the decode side's admission policy then queues it).
3. Of the two, choose the one whose heavy:light decode ratio is lowest once this
   request is added; ties go to the one with more free KV.
"""

from __future__ import annotations

import random
from typing import ClassVar

from common.load import DecodeLoad
from prefill_worker.dispatch.base import AcceptingDispatcher
from prefill_worker.views import ReqView


class PowerOfTwo(AcceptingDispatcher):
    name: ClassVar[str] = "power-of-two"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        fits = [ld for ld in candidates if ld.free_kv_blocks >= req.kv_blocks_upper(ld.block_size)]
        pool = fits or candidates
        pair = rng.sample(pool, 2) if len(pool) >= 2 else pool
        heavy = req.is_heavy(self.params.heavy_threshold_tokens)

        def ratio_after(ld: DecodeLoad) -> tuple[float, int]:
            h, light = ld.heavy + heavy, ld.light + (not heavy)
            return h / (light + 1), -ld.free_kv_blocks

        return min(pair, key=ratio_after)
