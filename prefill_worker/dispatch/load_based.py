"""Load-based dispatchers for experiments (TetriInfer Fig. 19, SCLS §4.5).

least-loaded  fewest running + queued requests; ties: more free KV, then id
imbalance     Fig. 19's worst case: heavy decodes always to the same workers (the first half by id),
              light ones to the rest; random within each group
max-min       SCLS §4.5 for one request at a time: the worker with the least estimated remaining
              work (Σ predicted tokens still to generate); the dispatcher adds the request's own
              expected tokens to its local copy until the next broadcast, which reflects what finished
"""

from __future__ import annotations

import random
from typing import ClassVar

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.dispatch.base import AcceptingDispatcher
from tetriserve.prefill_worker.views import ReqView


class LeastLoaded(AcceptingDispatcher):
    name: ClassVar[str] = "least-loaded"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        return min(candidates, key=lambda ld: (ld.running + ld.queued, -ld.free_kv_blocks, ld.worker_id))


class Imbalance(AcceptingDispatcher):
    name: ClassVar[str] = "imbalance"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        half = max(1, len(candidates) // 2)
        heavy, light = candidates[:half], candidates[half:] or candidates
        return rng.choice(heavy if req.is_heavy(self.params.heavy_threshold_tokens) else light)


class MaxMin(AcceptingDispatcher):
    name: ClassVar[str] = "max-min"

    def pick(self, req: ReqView, candidates: list[DecodeLoad], rng: random.Random) -> DecodeLoad:
        return min(candidates, key=lambda ld: (ld.remaining_tokens, -ld.free_kv_blocks, ld.worker_id))
