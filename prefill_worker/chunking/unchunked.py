"""No chunking: whole prompts per iteration, the baseline TetriInfer §3.3.3 / Fig. 16 compares against.

Prompts enter the iteration whole, in queue order, until the next one would
exceed the engine's ceiling (``max_budget``); a prompt is never split, so a
long one holds back every request batched with it.
"""

from __future__ import annotations

from typing import ClassVar

from tetriserve.prefill_worker.chunking.base import fill_in_order
from tetriserve.prefill_worker.views import Chunk, PrefillState


class Unchunked:
    name: ClassVar[str] = "none"

    def token_budget(self, state: PrefillState) -> int:
        return state.max_budget

    def plan(self, state: PrefillState) -> list[Chunk]:
        return fill_in_order(state.ordered, self.token_budget(state), whole_prompts=True)
