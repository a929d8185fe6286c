"""Decode admission policies: greedy (vLLM's), reserve-static, reserve-dynamic (TetriInfer §3.4),
cacheopt (CacheOpt §3.3), sola (SOLA §4.4.2, §5.1), accelgen (TBT slack order, AccelGen §4.3), scls (SCLS §4.3,
§4.4 Algorithm 1)."""

from __future__ import annotations

from collections.abc import Callable

from tetriserve.decode_worker.admission.accelgen import AccelGenDecode
from tetriserve.decode_worker.admission.base import AdmissionPolicy
from tetriserve.decode_worker.admission.cacheopt import CacheOptAdmission
from tetriserve.decode_worker.admission.greedy import Greedy
from tetriserve.decode_worker.admission.reserve_dynamic import ReserveDynamic
from tetriserve.decode_worker.admission.reserve_static import ReserveStatic
from tetriserve.decode_worker.admission.scls import SclsAdmission
from tetriserve.decode_worker.admission.sola import SolaDecode

ADMISSION_NAMES = ("greedy", "reserve-static", "reserve-dynamic", "cacheopt", "sola", "accelgen", "scls")


def make_admission_policy(name: str, **params: object) -> AdmissionPolicy:
    """``params`` go to the policy's constructor (e.g. cacheopt's ``reserve_blocks``)."""
    classes: dict[str, Callable[..., AdmissionPolicy]] = {
        c.name: c
        for c in (Greedy, ReserveStatic, ReserveDynamic, CacheOptAdmission, SolaDecode, AccelGenDecode, SclsAdmission)
    }
    if name not in classes:
        raise ValueError(f"decode.admission.policy: unknown policy {name!r}; known: {list(ADMISSION_NAMES)}")
    try:
        policy = classes[name](**params)
    except TypeError as exc:
        raise ValueError(f"decode admission policy {name!r}: {exc}") from None
    return policy


__all__ = ["ADMISSION_NAMES", "AdmissionPolicy", "make_admission_policy"]
