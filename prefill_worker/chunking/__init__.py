"""Prefill chunking policies: how many tokens an iteration computes and which chunks fill it.

fixed    ChunkSize tokens, slice-and-merge in queue order      TetriInfer §3.3.3
none     whole prompts (the unchunked baseline)                 TetriInfer Fig. 16
dynamic  S_b = S_pf·SLO_min/T̄_pf with ERA; optionally           AccelGen §4.2, §4.4
         multi-resource selection (Alg. 1/2)
"""

from __future__ import annotations

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.prefill_worker.chunking.base import ChunkingPolicy
from tetriserve.prefill_worker.chunking.dynamic import DynamicChunking, Selection
from tetriserve.prefill_worker.chunking.fixed import FixedChunking
from tetriserve.prefill_worker.chunking.unchunked import Unchunked

CHUNKING_NAMES = ("fixed", "none", "dynamic")


def make_chunking_policy(
    name: str,
    chunk_size: int,
    cost: CostEstimator | None = None,
    selection: Selection = "in-order",
    long_prompt_tokens: int | None = None,
    group_window_iters: float | None = None,
) -> ChunkingPolicy:
    """``long_prompt_tokens`` (ERA's threshold; None: S_pf) and ``group_window_iters`` (Alg. 2's γ in
    iterations of T_max) are dynamic chunking's."""
    if name == FixedChunking.name:
        return FixedChunking(chunk_size)
    if name == Unchunked.name:
        return Unchunked()
    if name == DynamicChunking.name:
        if cost is None:
            raise ValueError("prefill.chunking 'dynamic' needs a cost model (prefill.cost_profile)")
        return DynamicChunking(cost, long_prompt_tokens, select=selection, group_window_iters=group_window_iters)
    raise ValueError(f"prefill.chunking: unknown policy {name!r}; known: {list(CHUNKING_NAMES)}")


__all__ = ["CHUNKING_NAMES", "ChunkingPolicy", "make_chunking_policy"]
