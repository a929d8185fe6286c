"""AccelGen on the decode side: waiting requests by their TBT slack, tightest first (AccelGen §4.3).

A request waiting to decode is a token generation (TG) task. Its remaining time to its TBT SLO is §4.3's

    T_r = SLO_TBT − T_w − T_e,   T_e = N_ck · T_max = T_max   (a TG task is one chunk: N_ck = 1)

with T_w the time it has waited on this worker (``now − arrival``) and T_max the engine's recent decode
iteration time (``DecodeState.step_s``). Waiting requests are put to admission in ascending T_r, so the one
closest to missing its next token goes first; an order that differs from arrival order is counted as
``decided.accelgen.reordered``. A request without a TBT SLO (its own, or the ``slo`` section's) takes
``default_tbt_ms``, AccelGen's default of 0.1875 s a token, the normal reading speed
(``common/slo_config.READING_TBT_MS``): a human reading speed, so it needs no conversion to this hardware.

Admission itself is vLLM's test (the request's context fits the free KV now): AccelGen batches every TG task
that KV holds and keeps the previous iteration's TG tasks in the batch (§4.4), which vLLM's continuous
batching does.

    TBT 0.2 s, waited 0.05 s, step 0.02 s → T_r = 0.2 − 0.05 − 0.02 = 0.13 s
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.decisions import Decisions
from tetriserve.common.slo_config import READING_TBT_MS
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


class AccelGenDecode:
    name: ClassVar[str] = "accelgen"

    def __init__(self, default_tbt_ms: float = READING_TBT_MS) -> None:
        if default_tbt_ms <= 0:
            raise ValueError(f"accelgen admission: default_tbt_ms must be > 0, got {default_tbt_ms}")
        self.default_tbt_s = default_tbt_ms / 1000
        self.decisions = Decisions("accelgen")

    def tbt_slo_s(self, r: DecodeReqView) -> float:
        return r.tbt_slo_s if r.tbt_slo_s is not None else self.default_tbt_s

    def remaining_time(self, r: DecodeReqView, state: DecodeState) -> float:
        """T_r = SLO_TBT − T_w − T_max."""
        return self.tbt_slo_s(r) - max(0.0, state.now - r.arrival_time) - state.step_s

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        ordered = sorted(waiting, key=lambda r: (self.remaining_time(r, state), r.arrival_time, r.request_id))
        by_arrival = sorted(waiting, key=lambda r: (r.arrival_time, r.request_id))
        if any(a.request_id != b.request_id for a, b in zip(ordered, by_arrival, strict=True)):
            self.decisions.count("reordered")
        return ordered

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        return state.fits_now(req)
