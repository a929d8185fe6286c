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
(``multi_resource.select``), whose γ (the T_r window of one selection group) is
``group_window_iters`` iterations of T_max (AccelGen §6.1 sets γ = 0.75 s: four
iterations of at most 0.1875 s, the TBT SLO its iterations are sized to), or
``group_window_s`` seconds where that is not given. The requests Alg. 1 preempts
for an urgent one are ``preempted(state)``, counted as ``decided.accelgen.preempted``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.decisions import Decisions
from tetriserve.prefill_worker.chunking.base import fill_in_order
from tetriserve.prefill_worker.chunking.multi_resource import Selected, select
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
        group_window_iters: float | None = None,
    ) -> None:
        if select not in ("in-order", "multi-resource"):
            raise ValueError(f"prefill.chunk_selection: unknown {select!r}; known: in-order, multi-resource")
        if group_window_s < 0 or (group_window_iters is not None and group_window_iters < 0):
            raise ValueError("prefill.accelgen_group_window_iters: γ must be >= 0")
        self.cost = cost
        self.long_prompt_tokens = long_prompt_tokens if long_prompt_tokens is not None else cost.pivot_tokens
        self.selection: Selection = select
        self.group_window_s = group_window_s  # AccelGen Alg. 2's γ: T_r window of one selection group
        self.group_window_iters = group_window_iters  # γ in iterations of T_max (takes precedence when set)
        self.decisions = Decisions("accelgen")
        self._last: tuple[PrefillState, int, Selected] | None = None

    @property
    def preempts(self) -> bool:
        """Whether ``preempted`` may name requests (Alg. 1 runs only with multi-resource selection)."""
        return self.selection == "multi-resource"

    def window_s(self) -> float:
        """γ in seconds now: ``group_window_iters`` · T_max (corrected online), else ``group_window_s``."""
        if self.group_window_iters is not None:
            return self.group_window_iters * self.cost.iteration_seconds()
        return self.group_window_s

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
        return list(self._solve(state)[1].chunks)

    def preempted(self, state: PrefillState) -> list[str]:
        """The batch members Alg. 1 preempts this iteration to make room for urgent requests, first first."""
        return list(self._solve(state)[1].preempted)

    def _fill(self, state: PrefillState, budget: int) -> Selected:
        if self.selection == "multi-resource":
            return select(state, budget, self.long_prompt_tokens, self.window_s())
        return Selected(tuple(fill_in_order(state.ordered, budget, self.long_prompt_tokens)))

    def _solve(self, state: PrefillState) -> tuple[int, Selected]:
        last = self._last
        if last is not None and last[0] is state:  # token_budget and plan of one iteration: solve once
            return last[1], last[2]
        budget, selected = self._search(state)
        self._last = (state, budget, selected)
        self.decisions.count("preempted", len(selected.preempted))
        return budget, selected

    def _search(self, state: PrefillState) -> tuple[int, Selected]:
        by_id = {r.request_id: r for r in state.ordered}
        budget = self.budget_for(_slo_min(r for r in state.ordered[:1]), state)
        selected = self._fill(state, budget)
        for _ in range(8):
            slo_min = _slo_min(by_id[c.request_id] for c in selected.chunks)
            if slo_min is None:
                break
            tighter = self.budget_for(slo_min, state)
            if tighter >= budget:
                break
            budget, selected = tighter, self._fill(state, tighter)
        return budget, selected


def _slo_min(views: Iterable[ReqView]) -> float | None:
    slos = [r.ttft_slo_s for r in views if r.ttft_slo_s is not None]
    return min(slos) if slos else None
