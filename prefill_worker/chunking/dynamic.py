"""AccelGen §4.2: SLO-guaranteed dynamic chunking with Exclusive Request Allocation.

    S_b = S_pf · SLO_min / T̄_pf            (eq. 6; recomputed every iteration)

S_pf is the pivot forward size and T̄_pf its iteration time (``tetriserve
profile``; T̄_pf corrected online by SOLA eq. 5). SLO_min is the tightest
TTFT SLO among the requests the iteration takes; it depends on the budget, so
the budget is recomputed until it stops shrinking (at most a few rounds). With
no SLO in the iteration, S_b = S_pf. S_b is clamped to [block_size, the
engine's ceiling].

Tokens are then taken from the ordered queue until S_f = S_b, whatever request
they belong to; the last prompt touched is cut after the last token taken
(``fill_in_order``). ERA: a prompt longer than ``long_prompt_tokens`` (default
S_pf) does not start while another long prompt is in progress, so long prompts
hold KV one at a time. Example (AccelGen Fig. 9): with 522 tokens of short
requests ahead of a 6k prompt and S_b = 1024, the 6k prompt gets 502 tokens.

``select="multi-resource"`` replaces the in-order fill with Algorithm 1/2
(``multi_resource.select``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.prefill_worker.chunking.base import fill_in_order
from tetriserve.prefill_worker.chunking.multi_resource import select
from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView

Selection = Literal["in-order", "multi-resource"]


class DynamicChunking:
    name: ClassVar[str] = "dynamic"

    def __init__(
        self,
        cost: CostEstimator,
        long_prompt_tokens: int | None = None,
        select: Selection = "in-order",
        group_window_s: float = 0.01,
    ) -> None:
        if select not in ("in-order", "multi-resource"):
            raise ValueError(f"prefill.chunk_selection: unknown {select!r}; known: in-order, multi-resource")
        self.cost = cost
        self.long_prompt_tokens = long_prompt_tokens if long_prompt_tokens is not None else cost.pivot_tokens
        self.selection: Selection = select
        self.group_window_s = group_window_s  # AccelGen Alg. 2's γ: T_r window of one selection group
        self._last: tuple[PrefillState, int, tuple[Chunk, ...]] | None = None

    def budget_for(self, slo_min_s: float | None, state: PrefillState) -> int:
        """Eq. 6, clamped to [block_size, max_budget]."""
        if slo_min_s is None:
            raw = self.cost.pivot_tokens
        else:
            raw = int(self.cost.pivot_tokens * slo_min_s / self.cost.iteration_seconds())
        return max(min(state.block_size, state.max_budget), min(raw, state.max_budget))

    def token_budget(self, state: PrefillState) -> int:
        return self._solve(state)[0]

    def plan(self, state: PrefillState) -> list[Chunk]:
        return self._solve(state)[1]

    def _fill(self, state: PrefillState, budget: int) -> list[Chunk]:
        if self.selection == "multi-resource":
            return select(state, budget, self.long_prompt_tokens, self.group_window_s)
        return fill_in_order(state.ordered, budget, self.long_prompt_tokens)

    def _solve(self, state: PrefillState) -> tuple[int, list[Chunk]]:
        last = self._last
        if last is not None and last[0] is state:  # token_budget and plan of one iteration: solve once
            return last[1], list(last[2])
        budget, chunks = self._search(state)
        self._last = (state, budget, tuple(chunks))
        return budget, chunks

    def _search(self, state: PrefillState) -> tuple[int, list[Chunk]]:
        by_id = {r.request_id: r for r in state.ordered}
        budget = self.budget_for(_slo_min(r for r in state.ordered[:1]), state)
        chunks = self._fill(state, budget)
        for _ in range(8):
            slo_min = _slo_min(by_id[c.request_id] for c in chunks)
            if slo_min is None:
                break
            tighter = self.budget_for(slo_min, state)
            if tighter >= budget:
                break
            budget, chunks = tighter, self._fill(state, tighter)
        return budget, chunks


def _slo_min(views: Iterable[ReqView]) -> float | None:
    slos = [r.ttft_slo_s for r in views if r.ttft_slo_s is not None]
    return min(slos) if slos else None
