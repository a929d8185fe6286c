"""Interference-aware power-of-two dispatch (TetriInfer §3.3.4).

1. Split decode workers into those whose free KV fits the request's predicted
   upper range (prompt + upper output tokens) and those whose does not.
2. Pick two at random from the first set.
3. Of the two, choose the one whose heavy:light decode ratio is lowest once this
   request is added; ties go to the one with more free KV.

When no worker fits (the paper does not say what then), pick two at random from
all accepting workers and choose the one with the most free KV, the ratio only
breaking ties; the decode side's admission policy queues the request there. The
dispatcher's local copy of a load, debited for each request it sends until the
next broadcast (``base.account``), may go below zero, so "most free" is "least
overcommitted". Choosing by the ratio alone here would herd a burst: the ratio
(+1 smoothing) stays lowest on the worker that already holds the most light
requests, so most of a burst would land on one of two workers
(``benchmarks/decode_dispatch.py`` runs such bursts).
"""

from __future__ import annotations

import random
from typing import ClassVar

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.dispatch.base import AcceptingDispatcher
from tetriserve.prefill_worker.views import ReqView


class PowerOfTwo(AcceptingDispatcher):
    name: ClassVar[str] = "power-of-two"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        fits = [ld for ld in candidates if ld.free_kv_blocks >= req.kv_blocks_upper(ld.block_size)]
        pool = fits or candidates
        pair = rng.sample(pool, 2) if len(pool) >= 2 else pool
        heavy = req.is_heavy(self.params.heavy_threshold_tokens)

        def ratio_after(ld: DecodeLoad) -> float:
            return (ld.heavy + heavy) / (ld.light + (not heavy) + 1)

        if fits:
            return min(pair, key=lambda ld: (ratio_after(ld), -ld.free_kv_blocks))
        return min(pair, key=lambda ld: (-ld.free_kv_blocks, ratio_after(ld)))
