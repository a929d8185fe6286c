"""A worker's lifecycle and role (TetriInfer §3.5, Figure 10).

    STARTING ──activate──▶ ACTIVE ──drain(to_role)──▶ DRAINING ──flipping──▶ FLIPPING ──activate──▶ ACTIVE
                             ▲            (to_role None: removal)    │ (queue empty, requests               (new role)
                             │                                       │  handed over or finished)
                             └────────────── cancel ─────────────────┘
    any state ──die──▶ DEAD

Placement and dispatch see only ``ACTIVE`` workers: a draining worker takes no
new request and its own finish or hand over. A flip swaps the role with the
engine it has (no weight reload); TetriInfer measures 5–7 ms for that switch,
excluding the drain. Each flip records three durations from the monitor's clock,
and the worker's own timing of the swap on its engine (``engine_switch_s``, the
paper's flip time):

    drain_s         the decision (``drain``) to the drain's end (``flipping``)
    switch_s        the drain's end to the worker serving in its new role (``activate``), as the control plane
                    sees it (its ticks and the worker's first report in the new role included)
    first_served_s  the decision to the first request served in the new role (``served``)

The object is plain bookkeeping, no I/O: the flip controller keeps one per
worker and ``view()`` freezes it for ``status`` and the dashboard.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from tetriserve.common.load import Role


class Lifecycle(enum.Enum):
    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    FLIPPING = "flipping"
    DEAD = "dead"


@dataclass(frozen=True)
class FlipTiming:
    """Durations of one completed flip, seconds (``first_served_s`` None until a request was served)."""

    from_role: Role
    to_role: Role
    drain_s: float
    switch_s: float
    first_served_s: float | None = None
    engine_switch_s: float | None = None  # the role swap on the engine, timed by the worker (a flip in place)


@dataclass(frozen=True)
class LifecycleView:
    worker_id: str
    role: Role
    state: Lifecycle
    flips: int
    target_role: Role | None  # where a drain leads (None: nowhere, or a removal)
    removing: bool
    last_flip: FlipTiming | None

    @property
    def placeable(self) -> bool:
        return self.state is Lifecycle.ACTIVE


class WorkerLifecycle:
    """One worker's state and role; every transition checks where it comes from (``ValueError`` otherwise)."""

    def __init__(self, worker_id: str, role: Role, state: Lifecycle = Lifecycle.STARTING) -> None:
        self.worker_id = worker_id
        self.role = role
        self.state = state
        self.flips = 0
        self.target_role: Role | None = None
        self.removing = False
        self.last_flip: FlipTiming | None = None
        self._decided_at = 0.0
        self._drained_at = 0.0
        self._awaiting_first = False

    def view(self) -> LifecycleView:
        return LifecycleView(
            self.worker_id, self.role, self.state, self.flips, self.target_role, self.removing, self.last_flip
        )

    def _expect(self, action: str, *states: Lifecycle) -> None:
        if self.state not in states:
            allowed = " or ".join(s.value for s in states)
            raise ValueError(f"{self.worker_id}: cannot {action} while {self.state.value} (only when {allowed})")

    def activate(self, now: float, engine_switch_s: float | None = None) -> None:
        """Serving: after start-up, or in the new role at the end of a flip (``engine_switch_s``: how long the
        worker's own role swap took, if it timed one)."""
        self._expect("activate", Lifecycle.STARTING, Lifecycle.FLIPPING)
        if self.state is Lifecycle.FLIPPING and self.target_role is not None:  # flipping() checked the target
            drain_s, switch_s = self._drained_at - self._decided_at, now - self._drained_at
            self.last_flip = FlipTiming(self.role, self.target_role, drain_s, switch_s, None, engine_switch_s)
            self.role, self.target_role = self.target_role, None
            self.flips += 1
            self._awaiting_first = True
        self.state = Lifecycle.ACTIVE

    def drain(self, to_role: Role | None, now: float) -> None:
        """Stop taking requests, to flip to ``to_role`` or, with None, to be removed."""
        self._expect("drain", Lifecycle.ACTIVE)
        if to_role is not None and to_role is self.role:
            raise ValueError(f"{self.worker_id}: already {to_role.value}")
        self.state = Lifecycle.DRAINING
        self.target_role = to_role
        self.removing = to_role is None
        self._decided_at = now

    def flipping(self, now: float) -> None:
        """The drain is over: switch the role."""
        self._expect("flip", Lifecycle.DRAINING)
        if self.target_role is None:
            raise ValueError(f"{self.worker_id}: a worker drained for removal has no role to flip to")
        self.state = Lifecycle.FLIPPING
        self._drained_at = now

    def cancel(self) -> None:
        """Give up a drain or a flip that failed: serve in the old role again."""
        self._expect("cancel a drain", Lifecycle.DRAINING, Lifecycle.FLIPPING)
        self.state = Lifecycle.ACTIVE
        self.target_role = None
        self.removing = False

    def served(self, now: float) -> None:
        """A request was served; the first one after a flip completes its timing."""
        if self._awaiting_first and self.last_flip is not None:
            t = self.last_flip
            self.last_flip = replace(t, first_served_s=now - self._decided_at)
            self._awaiting_first = False

    def die(self) -> None:
        self.state = Lifecycle.DEAD
