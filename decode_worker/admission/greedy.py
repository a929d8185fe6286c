"""Greedy admission: vLLM's own behaviour (TetriInfer §3.4's baseline).

Admit whenever the request's current context fits the free KV; when the batch
grows past what the cache holds, vLLM preempts (recomputes) the newest request.
"""

from __future__ import annotations

from typing import ClassVar

from tetriserve.decode_worker.admission.base import ArrivalOrder
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


class Greedy(ArrivalOrder):
    name: ClassVar[str] = "greedy"

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        return state.fits_now(req)
