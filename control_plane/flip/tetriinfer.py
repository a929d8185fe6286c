"""``tetriinfer`` flip policy (TetriInfer §3.5; §5.1 flips an instance once it has been idle for a minute).

    every check, while no worker is starting, draining or flipping (one flip at a time):
        idle(w) = w ACTIVE and load(w) < threshold (default 10%) continuously, in its current role
        candidates = workers idle for at least ``interval_s`` (default 60 s)
                     whose role keeps ≥ ``min_prefill`` / ``min_decode`` ACTIVE workers without them
                     and, with ``require_demand``, whose other role has a worker at or over the threshold
        flip the one idle the longest (ties: by worker id) to the other role

The paper flips on idleness alone. ``require_demand`` (on by default) is ours: a
cluster idle on both sides would otherwise flip a worker every ``interval_s``
and back again, each time draining it for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tetriserve.common.load import Role
from tetriserve.control_plane.flip.base import ClusterSnapshot, FlipOrder, IdleTracker, Order, other


@dataclass(frozen=True)
class TetriInferParams:
    load_threshold: float = 0.10
    interval_s: float = 60.0
    min_prefill: int = 1
    min_decode: int = 1
    require_demand: bool = True

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValueError(f"flip.interval_s must be >= 0, got {self.interval_s}")
        for name in ("min_prefill", "min_decode"):
            if getattr(self, name) < 1:
                raise ValueError(f"flip.{name} must be >= 1, got {getattr(self, name)}")

    def least(self, role: Role) -> int:
        return self.min_prefill if role is Role.PREFILL else self.min_decode


class TetriInferFlip:
    name = "tetriinfer"

    def __init__(self, params: TetriInferParams | None = None) -> None:
        self.params = params or TetriInferParams()
        self._idle = IdleTracker(self.params.load_threshold)

    def decide(self, snapshot: ClusterSnapshot) -> list[Order]:
        p, now = self.params, snapshot.now
        self._idle.update(snapshot.workers, now)
        if snapshot.settling:
            return []
        candidates = []
        for w in snapshot.workers:
            idle_s = self._idle.idle_for(w.worker_id, now)
            if idle_s is None or idle_s < p.interval_s or len(snapshot.active(w.role)) - 1 < p.least(w.role):
                continue
            target = other(w.role)
            if p.require_demand and not any(v.load >= p.load_threshold for v in snapshot.active(target)):
                continue
            candidates.append((-idle_s, w.worker_id, w, target))
        if not candidates:
            return []
        neg_idle, _, w, target = min(candidates)
        self._idle.restart(w.worker_id, now)
        reason = f"load under {p.load_threshold:.0%} for {-neg_idle:.0f} s (interval {p.interval_s:g} s)"
        if p.require_demand:
            reason += f"; a {target.value} worker is at {p.load_threshold:.0%} or more"
        return [FlipOrder(w.worker_id, target, reason)]
