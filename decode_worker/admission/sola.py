"""SOLA on the decode side: predicted-TPOT order and the peak-memory admission check (SOLA §4.4.2, §5.1,
§5.2 eq. 4–5).

Order (§4.4.2): waiting decode requests in *descending* predicted TPOT,

    TPOT_r = (t_r^TPOT · l_r^out + C^d(Q^run) · l_r^left) / (l_r^out + l_r^left)

where t^TPOT · l^out is the time the request has spent on this worker so far
(``now − arrival``; a request that has waited here without a token already owes
its reader that time), C^d(Q^run) the decode iteration time of the running batch
and l^left the predicted remaining length (the estimate). The requests that would
miss their TPOT most go first.

C^d(Q^run) is eq. 4 over the running batch's contexts when the worker has a cost
profile, corrected online by eq. 5 (γ ← α·t/C₀ + (1 − α)·γ, with t the engine's
measured step time, ``DecodeState.step_s``, folded in at every step that orders
waiting requests); without a profile it is the measured step time itself.
Decisions (``decided.sola.reordered``): an order that differs from arrival order.

Admission (§5.1, after LightLLM): admit a request only if the batch's predicted
peak KV, with the newcomer, fits the KV the batch may use, i.e. the peak check
of ``peak.py`` at every predicted finish, using the point estimate. An empty batch
admits whatever fits now.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.decisions import Decisions
from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


def predicted_tpot(r: DecodeReqView, state: DecodeState, step_s: float | None = None) -> float:
    """``step_s``: C^d(Q^run); None: the measured step time."""
    cd = state.step_s if step_s is None else step_s
    left = r.predicted_remaining("estimate")
    tokens = r.generated + left
    spent = max(0.0, state.now - r.arrival_time)
    return (spent + cd * left) / tokens if tokens > 0 else spent


class SolaDecode:
    name: ClassVar[str] = "sola"

    def __init__(self, cost: CostEstimator | None = None) -> None:
        self.cost = cost
        self.decisions = Decisions("sola")

    def decode_step_s(self, state: DecodeState) -> float:
        """C^d(Q^run): eq. 4 over the running contexts, corrected by eq. 5 with the measured step time."""
        contexts = [r.context for r in state.running]
        if self.cost is None or not contexts:
            return state.step_s
        if state.step_s > 0:
            self.cost.observe_decode(contexts, state.step_s)
        return self.cost.decode_time(contexts) or state.step_s

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        cd = self.decode_step_s(state)
        ordered = sorted(waiting, key=lambda r: (-predicted_tpot(r, state, cd), r.arrival_time))
        arrival = sorted(waiting, key=lambda r: r.arrival_time)
        if any(a.request_id != b.request_id for a, b in zip(ordered, arrival, strict=True)):
            self.decisions.count("reordered")
        return ordered

    @staticmethod
    def remaining(r: DecodeReqView) -> int:
        return r.predicted_remaining("estimate")

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        return admits(req, state, self.remaining)
