"""``slo`` flip policy: keep TTFT and TPOT attainment by moving capacity to the side missing its objective,
and add workers instead of flipping while ``scale.max_workers`` allows (the autoscaler).

TetriInfer §3.5 leaves the policy pluggable; this one follows the SLO-driven planners of production
disaggregated servers (NVIDIA Dynamo's planner sizes the prefill and decode pools from the latency each misses).

    every check, while no worker is starting, draining or flipping and ``cooldown_s`` has passed since the last order:
        deficit(prefill) = ttft_target − TTFT attainment      (over the controller's sliding window)
        deficit(decode)  = tpot_target − TPOT attainment      (a side with no objective or no sample: 0)
        fewer than ``min_samples`` requests in the window: no decision on attainment
        the side X with the larger positive deficit needs capacity, unless it already has ``max_<X>`` workers:
            live workers < max_workers              ─▶ add a worker of X
            else the other side Y meets its target, keeps ≥ ``min_<Y>`` without one,
                 and its least loaded ACTIVE worker is under ``donor_max_load`` ─▶ flip that worker to X
        no deficit, autoscaling on (max_workers > 0) and more live workers than ``base_workers``:
            a worker idle (load < ``idle_threshold``) for ``idle_s`` whose side keeps ≥ ``min_<side>`` ─▶ remove it
"""

from __future__ import annotations

from dataclasses import dataclass

from tetriserve.common.load import Role
from tetriserve.control_plane.flip.base import (
    ClusterSnapshot,
    FlipOrder,
    IdleTracker,
    Order,
    RemoveOrder,
    ScaleOrder,
    other,
)


@dataclass(frozen=True)
class SloParams:
    ttft_target: float = 0.9
    tpot_target: float = 0.9
    min_samples: int = 20
    cooldown_s: float = 30.0
    min_prefill: int = 1
    min_decode: int = 1
    max_prefill: int | None = None
    max_decode: int | None = None
    base_workers: int = 0  # never removes below this many live workers
    idle_threshold: float = 0.10
    idle_s: float = 120.0
    donor_max_load: float = 0.5  # a worker busier than this is not spare capacity, whatever its side's SLO

    def __post_init__(self) -> None:
        for name in ("ttft_target", "tpot_target"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"flip.{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("min_prefill", "min_decode"):
            if getattr(self, name) < 1:
                raise ValueError(f"flip.{name} must be >= 1, got {getattr(self, name)}")
        for role in ("prefill", "decode"):
            high = getattr(self, f"max_{role}")
            if high is not None and high < getattr(self, f"min_{role}"):
                raise ValueError(f"flip.max_{role} ({high}) is below flip.min_{role}")
        if not 0 < self.donor_max_load <= 1:
            raise ValueError(f"flip.donor_max_load must be in (0, 1], got {self.donor_max_load}")
        if self.cooldown_s < 0 or self.idle_s < 0 or self.min_samples < 1:
            raise ValueError("flip.cooldown_s and flip.idle_s must be >= 0 and flip.min_samples >= 1")

    def bounds(self, role: Role) -> tuple[int, int | None]:
        if role is Role.PREFILL:
            return self.min_prefill, self.max_prefill
        return self.min_decode, self.max_decode


class SloFlip:
    name = "slo"

    def __init__(self, params: SloParams | None = None) -> None:
        self.params = params or SloParams()
        self._idle = IdleTracker(self.params.idle_threshold)
        self._last_order = float("-inf")

    def decide(self, snapshot: ClusterSnapshot) -> list[Order]:
        self._idle.update(snapshot.workers, snapshot.now)
        if snapshot.settling or snapshot.now - self._last_order < self.params.cooldown_s:
            return []
        orders = self._rebalance(snapshot) or self._scale_in(snapshot)
        if orders:
            self._last_order = snapshot.now
        return orders

    def _deficits(self, snapshot: ClusterSnapshot) -> dict[Role, float]:
        a, p = snapshot.attainment, self.params
        if a.samples < p.min_samples:
            return {Role.PREFILL: 0.0, Role.DECODE: 0.0}
        return {
            Role.PREFILL: 0.0 if a.ttft is None else p.ttft_target - a.ttft,
            Role.DECODE: 0.0 if a.tpot is None else p.tpot_target - a.tpot,
        }

    def _rebalance(self, snapshot: ClusterSnapshot) -> list[Order]:
        deficit = self._deficits(snapshot)
        needy = max((Role.PREFILL, Role.DECODE), key=lambda r: deficit[r])
        if deficit[needy] <= 0:
            return []
        donor = other(needy)
        _, high = self.params.bounds(needy)
        if high is not None and snapshot.count(needy) >= high:
            return []
        metric = "TTFT" if needy is Role.PREFILL else "TPOT"
        target = self.params.ttft_target if needy is Role.PREFILL else self.params.tpot_target
        attained = target - deficit[needy]
        why = f"{metric} attainment {attained:.0%} < {target:.0%} over {snapshot.attainment.samples} requests"
        if snapshot.live < snapshot.max_workers:
            return [ScaleOrder(needy, f"{why}; {snapshot.live} of at most {snapshot.max_workers} workers")]
        low, _ = self.params.bounds(donor)
        donors = snapshot.active(donor)
        if deficit[donor] > 0 or snapshot.count(donor) - 1 < low or not donors:
            return []
        chosen = min(donors, key=lambda w: (w.load, w.worker_id))
        if chosen.load >= self.params.donor_max_load:
            return []
        return [FlipOrder(chosen.worker_id, needy, f"{why}; {donor.value} meets its objective")]

    def _scale_in(self, snapshot: ClusterSnapshot) -> list[Order]:
        p, now = self.params, snapshot.now
        if snapshot.max_workers <= 0 or snapshot.live <= p.base_workers:
            return []
        idle = []
        for role in (Role.PREFILL, Role.DECODE):
            low, _ = p.bounds(role)
            for w in snapshot.active(role):
                idle_s = self._idle.idle_for(w.worker_id, now)
                if idle_s is not None and idle_s >= p.idle_s and snapshot.count(role) - 1 >= low:
                    idle.append((-idle_s, w.worker_id))
        if not idle:
            return []
        neg_idle, worker_id = min(idle)
        share = f"load < {p.idle_threshold:.0%}"
        reason = f"idle ({share}) for {-neg_idle:.0f} s; {snapshot.live} workers, base {p.base_workers}"
        return [RemoveOrder(worker_id, reason)]
