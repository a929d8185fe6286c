"""SOLA on the decode side: predicted-TPOT order and the peak-memory admission check (SOLA §4.4.2, §5.1).

Order (§4.4.2): waiting decode requests in *descending* predicted TPOT,

    TPOT_r = (t_r^TPOT · l_r^out + C^d(Q^run) · l_r^left) / (l_r^out + l_r^left)

where t^TPOT · l^out is the time the request has spent on this worker so far
(``now − arrival``; a request that has waited here without a token already owes
its reader that time), C^d(Q^run) the current decode iteration time
(``DecodeState.step_s``) and l^left the predicted remaining length (the
estimate). The requests that would miss their TPOT most go first.

Admission (§5.1, after LightLLM): admit a request only if the batch's predicted
peak KV, with the newcomer, fits the KV the batch may use, i.e. the peak check
of ``peak.py`` at every predicted finish, using the point estimate. An empty batch
admits whatever fits now.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


def predicted_tpot(r: DecodeReqView, state: DecodeState) -> float:
    left = r.predicted_remaining("estimate")
    tokens = r.generated + left
    spent = max(0.0, state.now - r.arrival_time)
    return (spent + state.step_s * left) / tokens if tokens > 0 else spent


class SolaDecode:
    name: ClassVar[str] = "sola"

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        return sorted(waiting, key=lambda r: (-predicted_tpot(r, state), r.arrival_time))

    @staticmethod
    def remaining(r: DecodeReqView) -> int:
        return r.predicted_remaining("estimate")

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        return admits(req, state, self.remaining)
