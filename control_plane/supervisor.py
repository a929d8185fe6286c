"""The supervisor's bookkeeping: which named actor is in which life, and when to re-create it.

Pure: no Ray. ``control_plane/supervision.py`` feeds it what Ray and the
ClusterMonitor say and carries out what it decides::

    ACTIVE ──died(name, incarnation)──────────────────────────▶ DEAD
    ACTIVE ──health "stale"/"stuck" for dead_after_s──(kill)─▶ DEAD
    DEAD ──due(now), after a backoff───▶ RESTARTING, incarnation + 1     (the adapter builds the actor)
    RESTARTING ──started()──▶ STARTING ──health "serving"──▶ ACTIVE
    RESTARTING ──start_failed()──▶ DEAD (next try after twice the backoff, at most ``max_backoff_s``)

    add(name, role) ──▶ DEAD, due at once, ``planned``      (a worker added by scaling: its life 0 is built)
    relabel(name, role) ──▶ same state, same life, new role    (a drained worker flipped in place)
    remove(name) ──▶ gone: never re-created                 (a drained worker removed by scaling)

An added worker's first life (``planned``) does not count as a restart.

Every report names the incarnation it is about; one about a previous life is
ignored, so a late death notice never kills the new life. The backoff resets
once a life has been ACTIVE for ``stable_after_s``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack


class ActorState(enum.StrEnum):
    STARTING = "starting"  # created and registered, no heartbeat yet
    ACTIVE = "active"
    DEAD = "dead"  # its life ended; re-created when due
    RESTARTING = "restarting"  # a new life is being built


@dataclass(frozen=True)
class Slot:
    """One named actor as the supervisor sees it."""

    name: str
    role: str  # prefill | decode | scheduler | monitor
    incarnation: int = 0
    restarts: int = 0
    state: ActorState = ActorState.STARTING
    since: float = 0.0  # when it entered ``state``
    reason: str = ""  # why it last died
    backoff_s: float = 0.0
    unhealthy_since: float | None = None  # first of an unbroken run of bad health reports
    planned: bool = False  # the next life was ordered (added), not a recovery


class _Changes(TypedDict, total=False):
    """The fields of a ``Slot`` a change of state may set besides its state and its time."""

    incarnation: int
    restarts: int
    reason: str
    backoff_s: float
    planned: bool


class Supervisor:
    def __init__(
        self,
        actors: Iterable[tuple[str, str]],
        *,
        dead_after_s: float = 10.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        stable_after_s: float = 60.0,
        now: float = 0.0,
    ) -> None:
        self.slots: dict[str, Slot] = {name: Slot(name, role, since=now) for name, role in actors}
        self.dead_after_s = dead_after_s
        self.base_backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_after_s = stable_after_s

    def _set(self, slot: Slot, now: float, state: ActorState, **kw: Unpack[_Changes]) -> Slot:
        new = replace(slot, state=state, since=now, unhealthy_since=None, **kw)
        self.slots[slot.name] = new
        return new

    def _current(self, name: str, incarnation: int) -> Slot | None:
        slot = self.slots.get(name)
        return slot if slot is not None and slot.incarnation == incarnation else None

    def died(self, name: str, incarnation: int, now: float, reason: str) -> bool:
        """Its life ``incarnation`` ended; True if that is news (the adapter then tells the monitor)."""
        slot = self._current(name, incarnation)
        if slot is None or slot.state is ActorState.DEAD:
            return False
        stable = slot.state is ActorState.ACTIVE and now - slot.since >= self.stable_after_s
        backoff = 0.0 if stable or slot.restarts == 0 else slot.backoff_s  # a life that died young waits
        self._set(slot, now, ActorState.DEAD, reason=reason, backoff_s=backoff)
        return True

    def health(self, name: str, incarnation: int, state: str, now: float) -> bool:
        """The monitor's view of a life (serving, starting, stale, stuck, dead); True if it must be killed now."""
        slot = self._current(name, incarnation)
        if slot is None or slot.state in (ActorState.DEAD, ActorState.RESTARTING):
            return False
        if state in ("serving", "draining"):
            if slot.state is ActorState.STARTING:
                self._set(slot, now, ActorState.ACTIVE)
            elif slot.unhealthy_since is not None:
                self.slots[name] = replace(slot, unhealthy_since=None)
            return False
        if state not in ("stale", "stuck"):
            return False
        if slot.unhealthy_since is None:
            self.slots[name] = replace(slot, unhealthy_since=now)
            return False
        return now - slot.unhealthy_since >= self.dead_after_s

    def due(self, now: float) -> list[Slot]:
        """The dead actors whose backoff has passed, now RESTARTING in their next incarnation: build them."""
        out = []
        for slot in list(self.slots.values()):
            if slot.state is ActorState.DEAD and now - slot.since >= slot.backoff_s:
                next_backoff = min(max(slot.backoff_s * 2, self.base_backoff_s), self.max_backoff_s)
                out.append(
                    self._set(
                        slot,
                        now,
                        ActorState.RESTARTING,
                        incarnation=slot.incarnation + 1,
                        restarts=slot.restarts + (0 if slot.planned else 1),
                        backoff_s=next_backoff,
                        planned=False,
                    )
                )
        return out

    def started(self, name: str, incarnation: int, now: float) -> None:
        """The new life is built and registered; ACTIVE once healthy (control-plane actors: at once)."""
        slot = self._current(name, incarnation)
        if slot is not None and slot.state is ActorState.RESTARTING:
            immediate = slot.role in ("scheduler", "monitor")
            self._set(slot, now, ActorState.ACTIVE if immediate else ActorState.STARTING)

    def add(self, name: str, role: str, now: float) -> None:
        """A new actor: its first life (incarnation 0) is due at once."""
        if name in self.slots:
            raise ValueError(f"{name} exists already")
        self.slots[name] = Slot(name, role, -1, 0, ActorState.DEAD, now, "added", planned=True)

    def relabel(self, name: str, role: str) -> Slot:
        """``name`` now plays ``role`` in the life it has (a flip in place); a later life is built in it."""
        slot = self.slots.get(name)
        if slot is None:
            raise ValueError(f"no actor named {name}")
        self.slots[name] = replace(slot, role=role)
        return self.slots[name]

    def remove(self, name: str) -> Slot | None:
        """Forget ``name``: it is never re-created (the adapter kills it)."""
        return self.slots.pop(name, None)

    def start_failed(self, name: str, incarnation: int, now: float, reason: str) -> None:
        slot = self._current(name, incarnation)
        if slot is not None and slot.state is ActorState.RESTARTING:
            self._set(slot, now, ActorState.DEAD, reason=reason)

    def view(self) -> list[Slot]:
        return sorted(self.slots.values(), key=lambda s: (s.role, s.name))
