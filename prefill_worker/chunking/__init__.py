"""Prefill chunking policies: how many tokens an iteration computes and which chunks fill it.

fixed    ChunkSize tokens, slice-and-merge in queue order      TetriInfer §3.3.3
none     whole prompts (the unchunked baseline)                 TetriInfer Fig. 16
dynamic  S_b = S_pf·SLO_min/T̄_pf with ERA; optionally           AccelGen §4.2, §4.4
         multi-resource selection (Alg. 1/2)
sola     k_i (eq. 1) or n_i (eq. 2) per the iteration's           SOLA §4.3, §4.4.1, §4.4.3
         problem (Table 2), from the state monitor
"""

from __future__ import annotations

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.prefill_worker.chunking.base import ChunkingPolicy
from tetriserve.prefill_worker.chunking.dynamic import DynamicChunking, Selection
from tetriserve.prefill_worker.chunking.fixed import FixedChunking
from tetriserve.prefill_worker.chunking.sola import DEFAULT_TILE_TOKENS, DEFAULT_WINDOW_ITERS, SolaWorkload
from tetriserve.prefill_worker.chunking.unchunked import Unchunked

CHUNKING_NAMES = ("fixed", "none", "dynamic", "sola")


def make_chunking_policy(
    name: str,
    chunk_size: int,
    cost: CostEstimator | None = None,
    selection: Selection = "in-order",
    long_prompt_tokens: int | None = None,
    group_window_iters: float | None = None,
    sola_tile_tokens: int | None = None,
    sola_window_iters: int = DEFAULT_WINDOW_ITERS,
) -> ChunkingPolicy:
    """``long_prompt_tokens`` (ERA's threshold; None: S_pf) and ``group_window_iters`` (Alg. 2's γ in
    iterations of T_max) are dynamic chunking's; ``sola_tile_tokens``: SOLA's tile (None or 0: the cost
    profile's measured one, else 128)."""
    if name == FixedChunking.name:
        return FixedChunking(chunk_size)
    if name == Unchunked.name:
        return Unchunked()
    if name == DynamicChunking.name:
        if cost is None:
            raise ValueError("prefill.chunking 'dynamic' needs a cost model (prefill.cost_profile)")
        return DynamicChunking(cost, long_prompt_tokens, select=selection, group_window_iters=group_window_iters)
    if name == SolaWorkload.name:
        if cost is None:
            raise ValueError("prefill.chunking 'sola' needs a cost model (prefill.cost_profile)")
        tile = sola_tile_tokens or cost.tile_tokens or DEFAULT_TILE_TOKENS
        return SolaWorkload(cost, tile, sola_window_iters)
    raise ValueError(f"prefill.chunking: unknown policy {name!r}; known: {list(CHUNKING_NAMES)}")


__all__ = ["CHUNKING_NAMES", "ChunkingPolicy", "make_chunking_policy"]
