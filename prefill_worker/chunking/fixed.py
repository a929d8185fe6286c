"""Fixed-size chunked prefill (TetriInfer §3.3.3, Fig. 7).

Every iteration computes ChunkSize prompt tokens — the size at which the
accelerator saturates — sliced from the scheduled requests and merged in the
queue policy's order. (TetriInfer pads a partial last chunk with zeros; vLLM
runs it unpadded, which only saves time.)
"""

from __future__ import annotations

from typing import ClassVar

from tetriserve.prefill_worker.chunking.base import fill_in_order
from tetriserve.prefill_worker.views import Chunk, PrefillState


class FixedChunking:
    name: ClassVar[str] = "fixed"

    def __init__(self, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"prefill.chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size

    def token_budget(self, state: PrefillState) -> int:
        return min(self.chunk_size, state.max_budget)

    def plan(self, state: PrefillState) -> list[Chunk]:
        return fill_in_order(state.ordered, self.token_budget(state))
