"""AccelGen §4.3: iteration-level SLO-based prioritisation by remaining time, urgent requests first.

    N_ck = ⌈S_r / L_c⌉                chunks left (S_r tokens left, L_c the average chunk)
    T_e  = N_ck · T_max               remaining execution time (T_max: one iteration at the pivot size)
    TTFT SLO:  T_r = SLO − T_w − T_e  (T_w: time since arrival)
    TG task (a request already decoding, colocated):  T_r = SLO_TBT − T_max  (N_ck = 1, T_w = 0: it returns
               from the iteration that just ran; without a TBT SLO, §4.3's default of 0.1875 s a token,
               the normal reading speed, unless it has a JCT SLO)
    JCT SLO:   per-iteration allowance T_it = (SLO_JCT − T_e,total) / (N_ck + S_g),
               T_e,total = N_ck·T_max + S_g·(T_max + P_max·P), S_g the predicted output length;
               T_r = T_it + carry − (time queued for this iteration), and after each iteration
               carry ← (T_it + carry) − waited, so early or late time carries over.

S_g is the length predictor's estimate on the request's view (its instant estimate until the prediction is
out), capped by ``max_tokens``; P_max is given in iterations of T_max and P as a probability.

Requests go in ascending T_r; one with T_r ≤ T_max is urgent (it must run in the
next iteration) and so comes first by construction. Requests without an SLO
have T_r = +∞ and keep arrival order behind those with one. An order that
differs from arrival order is counted as ``decided.accelgen.reordered``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import ClassVar

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.decisions import Decisions
from tetriserve.common.slo_config import READING_TBT_MS
from tetriserve.prefill_worker.views import ReqView


class AccelGenRemainingTime:
    name: ClassVar[str] = "accelgen"

    def __init__(
        self,
        cost: CostEstimator,
        chunk_tokens: int | None = None,
        preempt_max_iters: float = 0.0,
        preempt_probability: float = 0.0,
    ) -> None:
        if preempt_max_iters < 0 or not 0.0 <= preempt_probability <= 1.0:
            raise ValueError("accelgen: P_max must be >= 0 iterations and P within [0, 1]")
        self.cost = cost
        self.chunk_tokens = chunk_tokens  # L_c; None: the pivot forward size
        self.preempt_max_iters = preempt_max_iters  # P_max, in iterations of T_max
        self.preempt_probability = preempt_probability  # P
        self.decisions = Decisions("accelgen")
        self._carry: dict[str, float] = {}

    def _chunks_left(self, r: ReqView) -> int:
        lc = self.chunk_tokens or self.cost.pivot_tokens
        return max(1, math.ceil(r.remaining_tokens / lc))

    def preempt_penalty_s(self) -> float:
        """P_max · P in seconds: the expected preemption time after one token generation."""
        return self.preempt_max_iters * self.cost.iteration_seconds() * self.preempt_probability

    def iteration_allowance(self, r: ReqView) -> float:
        """JCT SLO spread evenly over the request's iterations (T_it), before carry-over."""
        if r.jct_slo_s is None:
            return math.inf
        t_max = self.cost.iteration_seconds()
        n_ck = max(1, math.ceil(r.prompt_len / (self.chunk_tokens or self.cost.pivot_tokens)))
        s_g = r.expected_output()
        t_e = n_ck * t_max + s_g * (t_max + self.preempt_penalty_s())
        return (r.jct_slo_s - t_e) / (n_ck + s_g)

    def remaining_time(self, r: ReqView, now: float) -> float:
        if r.remaining_tokens == 0 and r.prompt_len > 0:  # a TG task: its next token is due within its TBT SLO
            if r.tbt_slo_s is None and r.jct_slo_s is not None:
                return self.iteration_allowance(r) + self._carry.get(r.request_id, 0.0)
            tbt = r.tbt_slo_s if r.tbt_slo_s is not None else READING_TBT_MS / 1000
            return tbt - self.cost.iteration_seconds()
        if r.ttft_slo_s is not None:
            return r.ttft_slo_s - (now - r.arrival_time) - self._chunks_left(r) * self.cost.iteration_seconds()
        if r.jct_slo_s is not None:
            since = r.queued_since if r.queued_since is not None else r.arrival_time
            return self.iteration_allowance(r) + self._carry.get(r.request_id, 0.0) - (now - since)
        return math.inf

    def remaining_times(self, waiting: Iterable[ReqView], now: float) -> dict[str, float]:
        return {r.request_id: self.remaining_time(r, now) for r in waiting}

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]:
        tr = self.remaining_times(waiting, now)
        ordered = sorted(waiting, key=lambda r: (tr[r.request_id], r.arrival_time, r.request_id))
        by_arrival = sorted(waiting, key=lambda r: (r.arrival_time, r.request_id))
        if any(a.request_id != b.request_id for a, b in zip(ordered, by_arrival, strict=True)):
            self.decisions.count("reordered")
        return ordered

    def on_scheduled(self, scheduled: Iterable[ReqView], now: float) -> None:
        """Carry a JCT request's unused (or overdrawn) waiting time into its next iteration."""
        for r in scheduled:
            if r.jct_slo_s is None or r.ttft_slo_s is not None:
                continue
            since = r.queued_since if r.queued_since is not None else r.arrival_time
            allowed = self.iteration_allowance(r) + self._carry.get(r.request_id, 0.0)
            self._carry[r.request_id] = allowed - (now - since)

    def forget(self, request_id: str) -> None:
        self._carry.pop(request_id, None)
