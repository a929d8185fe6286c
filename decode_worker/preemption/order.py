"""Which running request to preempt first when the KV cache runs out (CacheOpt §2.4, §3.4).

``victims(running)`` returns the running batch in the order its members would be
preempted, first victim first:

    vllm      the latest arrival first (vLLM's FCFS: the newest request in the batch)
    srtf      the longest predicted remaining time first (Shortest-Remaining-Time-First keeps
              the jobs that will release their KV soonest)
    lkvo      the smallest KV occupancy first (Lowest-KVC-Occupancy: the cheapest to recompute or swap)
    cacheopt  bucketed (§3.4): loosest TBT SLO first (buckets 0.05–0.2 s, 0.2–0.5 s, 0.5–2 s, looser;
              no SLO is loosest), then, among similar SLOs, the longest predicted remaining time
              (128-token buckets), then the smallest KV occupancy (128-token buckets)
    accelgen  the largest remaining time first (AccelGen §4.4, Alg. 1 line 3): a running TG task's
              T_r = SLO_TBT − T_max (§4.3, T_w = 0), so the loosest TBT SLO first, no SLO taken as the
              reading speed 0.1875 s; among equal SLOs the latest arrival (vLLM's). An order whose first
              victim is not vLLM's is counted as ``decided.accelgen.reordered``

Every order puts a request that is mid-transfer (its KV being loaded, swapped out
or shipped to another worker) last: freeing its blocks would lose KV in flight.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.decisions import Decisions
from tetriserve.common.slo_config import READING_TBT_MS
from tetriserve.decode_worker.views import DecodeReqView

TBT_EDGES_S = (0.05, 0.2, 0.5, 2.0)
TOKEN_BUCKET = 128


class PreemptionOrder:
    """Base: subclasses give ``key`` (smaller = preempted sooner)."""

    name: ClassVar[str] = ""

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        raise NotImplementedError

    def victims(self, running: Sequence[DecodeReqView]) -> list[DecodeReqView]:
        return sorted(running, key=lambda r: (r.transferring, *self.key(r)))


class VllmOrder(PreemptionOrder):
    name: ClassVar[str] = "vllm"

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        return (-r.arrival_time,)


class SrtfOrder(PreemptionOrder):
    name: ClassVar[str] = "srtf"

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        return (-r.predicted_remaining("estimate"), -r.arrival_time)


class LkvoOrder(PreemptionOrder):
    name: ClassVar[str] = "lkvo"

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        return (r.context, -r.arrival_time)


def tbt_bucket(slo_s: float | None) -> int:
    """0 for the tightest SLOs, up to len(TBT_EDGES_S) for the loosest; no SLO is looser than any."""
    return len(TBT_EDGES_S) + 1 if slo_s is None else bisect.bisect_left(TBT_EDGES_S, slo_s)


class CacheOptOrder(PreemptionOrder):
    name: ClassVar[str] = "cacheopt"

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        return (
            -tbt_bucket(r.tbt_slo_s),
            -(r.predicted_remaining("estimate") // TOKEN_BUCKET),
            r.context // TOKEN_BUCKET,
            -r.arrival_time,
        )


class AccelGenOrder(PreemptionOrder):
    name: ClassVar[str] = "accelgen"

    def __init__(self) -> None:
        self.decisions = Decisions("accelgen")

    def key(self, r: DecodeReqView) -> tuple[float, ...]:
        tbt = r.tbt_slo_s if r.tbt_slo_s is not None else READING_TBT_MS / 1000
        return (-tbt, -r.arrival_time)

    def victims(self, running: Sequence[DecodeReqView]) -> list[DecodeReqView]:
        order = super().victims(running)
        if order and order[0] is not VllmOrder().victims(running)[0]:
            self.decisions.count("reordered")
        return order


ORDERS: dict[str, type[PreemptionOrder]] = {
    c.name: c for c in (VllmOrder, SrtfOrder, LkvoOrder, CacheOptOrder, AccelGenOrder)
}
ORDER_NAMES = tuple(ORDERS)


def make_preemption_order(name: str) -> PreemptionOrder:
    if name not in ORDERS:
        raise ValueError(f"decode.preemption.order: unknown order {name!r}; known: {list(ORDER_NAMES)}")
    return ORDERS[name]()
