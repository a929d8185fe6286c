"""SOLA §4.4.3, eq. 1–2: the constrained workload of an iteration (k_i or n_i), per the problem of §4.4.1.

Every iteration the state monitor (SOLA §4.3, ``common/sola_state.py``) is updated with the engine's prompts
and, on a colocated engine, its decoding requests; the problem switch (§4.4.1, Table 2,
``common/sola_strategy.py``) chooses what the iteration optimises; then the workload is sized so the other
latency stays within its SLO:

- **Optimise TTFT subject to TPOT** (eq. 1): prompts first, as many prompt tokens as the decoding requests'
  TPOT allows. k_i is the largest multiple of the tile size k with

      a%-max_{r decoding, t_r^TPOT > 0} ( t_r^TPOT + Cᵖ(Q^run) / l_r^out ) / T_r^TPOT ≤ 1

  where Cᵖ(Q^run) is eq. 3's time (corrected by eq. 5) of the chunks the queue order fills k tokens with; the
  iteration's prompt tokens are those k, filled in the queue policy's order. With no decoding request to hold
  to its TPOT, k_i is the largest multiple of the tile at or below the engine's ceiling; with none holding,
  k_i = 0 and the iteration only decodes. n_i is not set.
- **Optimise TPOT subject to TTFT** (eq. 2): decodes first, as few prompts as the waiting ones' TTFT allows.
  n_i is the smallest number of prompts, taken in the queue policy's order, with

      a%-max_{r waiting} ( t_r^TTFT + Cᵖ(Q^run) + Cᵈ(Q^run) + Cᵖ(r) ) / T_r^TTFT ≤ 1

  over the prompts left waiting, where Cᵖ(Q^run) is the time of the first n prompts' chunks in the engine's
  ceiling, Cᵈ(Q^run) eq. 4's time of the decoding batch (corrected by eq. 5 on the decode model), and Cᵖ(r)
  the waiting prompt's own prefill time in chunks of the pivot size. The n prompts take what the ceiling
  allows (k_i is not set). With nothing decoding, at least one prompt runs: an iteration with no work serves
  no one.

a%-max is the maximum, or the a%-level maximum when §4.4.1 loosens the constraint. Each request is held to its
own SLO; one without that SLO is in neither constraint.

On a prefill engine (disaggregated) no request decodes: p^TPOT is 0, every iteration optimises TTFT, and k_i is
the tile-quantised ceiling. The tile size is a hardware quantum: SOLA's example is 128 on A100 GPUs;
``prefill.sola_tile_tokens`` sets it, by default the tile ``tetriserve profile`` measured
(``common/cost_profile.py``'s ``find_tile``), else 128.

What Algorithm 1 does that vLLM's scheduler does here (``docs/design/colocated.md``): every running decode takes
its token each iteration, so neither problem leaves a decode out (eq. 1's "decodes added one by one until k_i"
is vLLM's own), and the phase-level order is carried by the budget — prompts get the ceiling under TTFT, or
as few as eq. 2 allows under TPOT.

Decisions (``decided.sola.*``, besides the switch's ``tpot_iterations``, ``switched_to_tpot``, ``loosened``):
``k_capped``, an iteration whose k_i eq. 1 set below the tile-quantised ceiling while prompt tokens waited
beyond it; ``n_limited``, an iteration whose n_i kept back prompts the ceiling had room for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.decisions import Decisions
from tetriserve.common.sola_state import Observed, RequestState, StateMonitor, SystemState
from tetriserve.common.sola_strategy import Problem, ProblemSwitch, level_max
from tetriserve.prefill_worker.chunking.base import fill_in_order
from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView

DEFAULT_TILE_TOKENS = 128  # SOLA §4.4.3's example: the tile size of A100 GPUs
DEFAULT_WINDOW_ITERS = 8


def observed(r: ReqView) -> Observed:
    """A prompt still to compute, as the state monitor reads it."""
    estimate = r.estimate.estimate if r.estimate is not None else None
    return Observed(r.request_id, r.arrival_time, r.prompt_len, r.max_tokens, 0, r.ttft_slo_s, None, estimate)


def _work(chunks: Sequence[Chunk]) -> list[tuple[int, int]]:
    return [(c.start, c.tokens) for c in chunks]


class SolaWorkload:
    name: ClassVar[str] = "sola"
    reads_decoding: ClassVar[bool] = True  # the adapter passes the engine's decoding requests in the state

    def __init__(
        self, cost: CostEstimator, tile_tokens: int = DEFAULT_TILE_TOKENS, window_iters: int = DEFAULT_WINDOW_ITERS
    ) -> None:
        if tile_tokens < 1:
            raise ValueError(f"prefill.sola_tile_tokens must be >= 1, got {tile_tokens}")
        self.cost = cost
        self.tile_tokens = tile_tokens
        self.decisions = Decisions("sola")
        self.monitor = StateMonitor()
        self.switch = ProblemSwitch(window_iters, self.decisions)
        self.last_state: SystemState | None = None
        self._budget: int | None = None

    def top(self, max_budget: int) -> int:
        """The largest multiple of the tile at or below the ceiling (the ceiling itself below one tile)."""
        return (max_budget // self.tile_tokens) * self.tile_tokens or max_budget

    def token_budget(self, state: PrefillState) -> int:
        """The budget the last ``plan`` set: k_i, or the ceiling under eq. 2's n_i."""
        return self._budget if self._budget is not None else self.top(state.max_budget)

    def observe(self, state: PrefillState) -> SystemState:
        """Update the state monitor with the iteration's requests (SOLA §4.3)."""
        used = None
        if state.total_kv_blocks is not None and state.free_kv_blocks is not None:
            used = state.total_kv_blocks - state.free_kv_blocks
        observed_now = [observed(r) for r in state.ordered] + list(state.decoding)
        sys = self.monitor.update(state.now, observed_now, used or 0, state.total_kv_blocks)
        self.last_state = sys
        return sys

    def plan(self, state: PrefillState) -> list[Chunk]:
        sys = self.observe(state)
        problem = self.switch.decide(sys)
        if problem.objective == "ttft":
            k = self.k_ttft(state, sys, problem)
            self._budget = k
            return fill_in_order(state.ordered, k)
        n = self.n_tpot(state, sys, problem)
        self._budget = state.max_budget
        return fill_in_order(state.ordered[:n], state.max_budget)

    # -- eq. 1 ---------------------------------------------------------------------------
    @staticmethod
    def _tpot_bound(sys: SystemState) -> list[RequestState]:
        return [r for r in sys.requests if r.t_tpot > 0 and r.tpot_slo_s and r.l_out > 0]

    def k_ttft(self, state: PrefillState, sys: SystemState, problem: Problem) -> int:
        """k_i (eq. 1): the largest tile multiple whose prompt chunks keep the decodes' TPOT within the SLO."""
        top = self.top(state.max_budget)
        bound = self._tpot_bound(sys)
        if not bound:
            return top

        def holds(k: int) -> bool:
            cp = self.cost.prefill_time(_work(fill_in_order(state.ordered, k)))
            terms = [(r.t_tpot + cp / r.l_out) / (r.tpot_slo_s or 1.0) for r in bound]
            return level_max(terms, problem.level) <= 1.0

        # Cᵖ grows with k (the coefficients are non-negative), so the tiles that hold are a prefix: bisect them
        step = min(self.tile_tokens, top)
        lo, hi = 0, top // step  # holds(lo·step) is assumed (no prompt tokens, Cᵖ = 0), hi·step = top
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if holds(mid * step):
                lo = mid
            else:
                hi = mid - 1
        k = lo * step
        if k < top and sum(r.remaining_tokens for r in state.ordered) > k:
            self.decisions.count("k_capped")
        return k

    # -- eq. 2 ---------------------------------------------------------------------------
    def n_tpot(self, state: PrefillState, sys: SystemState, problem: Problem) -> int:
        """n_i (eq. 2): the fewest prompts whose iteration keeps every prompt left waiting within its TTFT."""
        prompts = state.ordered
        room = len(fill_in_order(prompts, state.max_budget))  # beyond these the ceiling gives no prompt a token
        decoding = [r for r in sys.requests if not r.prefilling]
        cd = self.cost.decode_time([r.l_in + r.l_out for r in decoding])
        pivot = self.cost.pivot_tokens
        states = {r.request_id: r for r in sys.requests}
        own: list[tuple[float, float] | None] = []  # per prompt: (t^TTFT + Cᵖ(r), T^TTFT), None without an SLO
        for r in prompts:
            rs = states.get(r.request_id)
            if rs is None or not r.ttft_slo_s:
                own.append(None)
                continue
            left = self.cost.request_prefill_time(r.computed_tokens, r.remaining_tokens, pivot)
            own.append((rs.t_ttft + left, r.ttft_slo_s))
        n = room
        for candidate in range(room + 1):
            cp = self.cost.prefill_time(_work(fill_in_order(prompts[:candidate], state.max_budget)))
            terms = [(e[0] + cp + cd) / e[1] for e in own[candidate:] if e is not None]
            if level_max(terms, problem.level) <= 1.0:
                n = candidate
                break
        if n == 0 and prompts and not decoding:
            n = 1
        if n < room:
            self.decisions.count("n_limited")
        return n
