"""The flip policy seam (``docs/design/policy-seam.md``): ``decide(cluster_snapshot) -> list[order]``.

    flip controller ──each check──▶ ClusterSnapshot (workers: role, lifecycle, load; SLO attainment; bounds)
                                          │
                                          ▼
                              policy.decide(snapshot) ──▶ [FlipOrder | ScaleOrder | RemoveOrder], each with a reason

A policy knows nothing of Ray or vLLM. It may keep state between calls (how long
a worker has been idle) but reads the time only from ``snapshot.now``, so a test
replays a sequence of hand-built snapshots. The controller carries the orders
out (drain, flip, add, remove) and logs each with its reason.

``load`` is a worker's utilisation in [0, 1] as the controller computes it from
the workers' load reports: the share of recent time its engine had work
(``flip.load_window_s``), for either role.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tetriserve.common.lifecycle import Lifecycle
from tetriserve.common.load import Role


def other(role: Role) -> Role:
    return Role.DECODE if role is Role.PREFILL else Role.PREFILL


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    role: Role
    state: Lifecycle
    load: float  # utilisation, 0..1
    queued: int = 0
    running: int = 0


@dataclass(frozen=True)
class Attainment:
    """Share of the requests finished in the sliding window that met their TTFT / TPOT objective (None: no
    objective set or no sample); ``samples``: the requests with an objective."""

    ttft: float | None = None
    tpot: float | None = None
    samples: int = 0


@dataclass(frozen=True)
class ClusterSnapshot:
    now: float  # seconds, the controller's clock
    workers: tuple[WorkerView, ...]
    attainment: Attainment = field(default_factory=Attainment)
    max_workers: int = 0  # scale.max_workers: more workers may be added up to this count (0: never)

    def active(self, role: Role) -> list[WorkerView]:
        return [w for w in self.workers if w.role is role and w.state is Lifecycle.ACTIVE]

    def count(self, role: Role) -> int:
        """Workers of ``role`` that serve or will (starting ones too; draining ones are on their way out)."""
        return sum(1 for w in self.workers if w.role is role and w.state in (Lifecycle.STARTING, Lifecycle.ACTIVE))

    @property
    def settling(self) -> bool:
        """A worker is starting, draining or flipping: the last order has not played out yet."""
        return any(w.state in (Lifecycle.STARTING, Lifecycle.DRAINING, Lifecycle.FLIPPING) for w in self.workers)

    @property
    def live(self) -> int:
        return sum(1 for w in self.workers if w.state is not Lifecycle.DEAD)


@dataclass(frozen=True)
class FlipOrder:
    worker_id: str
    to_role: Role
    reason: str


@dataclass(frozen=True)
class ScaleOrder:
    """Add one worker of ``role``."""

    role: Role
    reason: str


@dataclass(frozen=True)
class RemoveOrder:
    """Drain ``worker_id`` and remove it."""

    worker_id: str
    reason: str


Order = FlipOrder | ScaleOrder | RemoveOrder


class FlipPolicy(Protocol):
    name: str

    def decide(self, snapshot: ClusterSnapshot) -> list[Order]: ...


class IdleTracker:
    """Since when each worker has been continuously under a load threshold in its current role, ACTIVE."""

    def __init__(self, threshold: float) -> None:
        if not 0 <= threshold <= 1:
            raise ValueError(f"load_threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold
        self._since: dict[str, tuple[Role, float]] = {}

    def update(self, workers: Iterable[WorkerView], now: float) -> None:
        seen = set()
        for w in workers:
            seen.add(w.worker_id)
            idle = w.state is Lifecycle.ACTIVE and w.load < self.threshold
            prior = self._since.get(w.worker_id)
            if not idle:
                self._since.pop(w.worker_id, None)
            elif prior is None or prior[0] is not w.role:
                self._since[w.worker_id] = (w.role, now)
        for gone in set(self._since) - seen:
            del self._since[gone]

    def idle_for(self, worker_id: str, now: float) -> float | None:
        """Seconds ``worker_id`` has been idle (None if it is not idle)."""
        entry = self._since.get(worker_id)
        return None if entry is None else now - entry[1]

    def restart(self, worker_id: str, now: float) -> None:
        """Count ``worker_id``'s idleness from ``now`` (an order was given about it)."""
        if worker_id in self._since:
            self._since[worker_id] = (self._since[worker_id][0], now)
