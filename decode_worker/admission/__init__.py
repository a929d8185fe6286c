"""Decode admission policies (TetriInfer §3.4): greedy (vLLM's), reserve-static, reserve-dynamic."""

from __future__ import annotations

from decode_worker.admission.base import AdmissionPolicy
from decode_worker.admission.greedy import Greedy
from decode_worker.admission.reserve_dynamic import ReserveDynamic
from decode_worker.admission.reserve_static import ReserveStatic

ADMISSION_NAMES = ("greedy", "reserve-static", "reserve-dynamic")


def make_admission_policy(name: str) -> AdmissionPolicy:
    if name == Greedy.name:
        return Greedy()
    if name == ReserveStatic.name:
        return ReserveStatic()
    if name == ReserveDynamic.name:
        return ReserveDynamic()
    raise ValueError(f"decode.admission_policy: unknown policy {name!r}; known: {list(ADMISSION_NAMES)}")


__all__ = ["ADMISSION_NAMES", "AdmissionPolicy", "make_admission_policy"]
