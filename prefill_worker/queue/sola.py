"""SOLA §4.4.2, prefill level: order by predicted TTFT, highest first.

    predicted TTFT(r) = t_TTFT(r) + Cᵖ(r)
        t_TTFT(r): the TTFT it has accumulated so far (now − arrival)
        Cᵖ(r):     its remaining prefill time from the cost model (eq. 3, corrected by eq. 5)

The request most at risk of a late first token goes first. Cᵖ(r) assumes the
request's remaining tokens run in chunks of the pivot size.

Decisions (``decided.sola.reordered``): an ordering that differs from arrival order,
the FCFS default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.decisions import Decisions
from tetriserve.prefill_worker.queue.base import Stateless
from tetriserve.prefill_worker.views import ReqView


class SolaTTFT(Stateless):
    name: ClassVar[str] = "sola"

    def __init__(self, cost: CostEstimator) -> None:
        self.cost = cost
        self.decisions = Decisions("sola")

    def predicted_ttft(self, r: ReqView, now: float) -> float:
        chunk = self.cost.pivot_tokens
        return (now - r.arrival_time) + self.cost.request_prefill_time(r.computed_tokens, r.remaining_tokens, chunk)

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]:
        ordered = sorted(waiting, key=lambda r: (-self.predicted_ttft(r, now), r.arrival_time, r.request_id))
        fcfs = sorted(waiting, key=lambda r: (r.arrival_time, r.request_id))
        if any(a.request_id != b.request_id for a, b in zip(ordered, fcfs, strict=True)):
            self.decisions.count("reordered")
        return ordered
