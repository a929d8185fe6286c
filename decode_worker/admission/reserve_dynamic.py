"""Reserve-dynamic admission (TetriInfer §3.4).

Admit a request only if KV is still free when jobs in the batch finish, from
predicted remaining tokens (the range's lower end, as in the paper). A batch of
growing requests holds the most KV just before one of them finishes, so the
check runs at those moments:

    capacity = free + Σ_batch held_i + held_new  (blocks the batch holds now)
    usage(k) = Σ_{r ∈ batch ∪ {new}, rem_r ≥ k} blocks(context_r + k)    (k steps from now)
    admit ⇔  usage(k) ≤ capacity for k ∈ horizons

``horizons="shortest"`` is the paper's sentence taken literally — k = the
shortest remaining job in the batch only (0 if one finishes this very step).
That admits a long request whenever one short job is in the batch, and on
this engine it preempts under pressure where greedy does
(tests/integration/test_decode_admission.py). ``horizons="all"`` (the
default) checks every predicted finish in the batch and the new request's
own, so with exact predictions nothing admitted is ever preempted. An empty
batch admits whatever fits now, so a request larger than the cache still runs
(alone).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from tetriserve.decode_worker.admission.base import ArrivalOrder
from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, LengthEnd

Horizons = Literal["all", "shortest"]


class ReserveDynamic(ArrivalOrder):
    name: ClassVar[str] = "reserve-dynamic"

    def __init__(self, end: LengthEnd = "lower", horizons: Horizons = "all") -> None:
        if horizons not in ("all", "shortest"):
            raise ValueError(f"decode.admission.horizons: unknown {horizons!r}; known: all, shortest")
        self.end: LengthEnd = end
        self.horizons: Horizons = horizons

    def horizon(self, state: DecodeState) -> int:
        """Steps until the shortest job in the batch finishes (by prediction)."""
        return min((r.predicted_remaining(self.end) for r in state.running), default=0)

    def remaining(self, r: DecodeReqView) -> int:
        return r.predicted_remaining(self.end)

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        horizons = [self.horizon(state)] if self.horizons == "shortest" else None
        return admits(req, state, self.remaining, horizons=horizons)
