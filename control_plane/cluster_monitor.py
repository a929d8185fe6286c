"""ClusterMonitor (TetriInfer §3.2): collects load reports and broadcasts decode loads.

Every worker looks at its load every ``report_interval_ms`` and reports it when
it has changed (beyond ``report_tolerance``), or else once every
``heartbeat_interval_ms`` (common/load.py).
On the same period the monitor sends the latest decode loads to every prefill
worker, whose dispatcher decides locally, and the latest prefill loads to the
GlobalScheduler, when a load or the set of serving workers has changed since its
last broadcast, or else once a heartbeat: an idle cluster exchanges a few
messages a second instead of tens (they cost CPU the engines share). Decode
endpoints and actor handles travel only when a prefill worker has not seen them
in their current life (``incarnation``): a decode worker re-created on a new KV
port is announced again.

Liveness is judged here, by this monitor's clock, from the reports (they are
the workers' heartbeats): a worker is ``starting`` before its first report of
its current life, ``stale`` once none has arrived for ``stale_after`` periods
(and at least three heartbeats), ``stuck`` while its engine has work and its
step counter has not moved for ``stuck_after_s``, ``dead`` once the supervisor says so (``mark_dead``),
``draining`` while the elastic controller drains it (``drain``: to flip it or remove it), else ``serving``.
Only ``serving`` workers are broadcast, so placement and dispatch never see
another. Reports of a previous life are dropped.

SCLS slice rebalancing (§4.5, §4.6, §7) runs here too, because the monitor has
every decode worker's load: each round pairs the most loaded decode worker that
slices with the least loaded one (``decode_worker.slices.plan``) and orders the
source to move requests at their next slice boundary; the next round comes after
T = max(λ · min_w T_load(w), Γ) (eq. 12). Nothing is ordered while no decode
worker has ``slice_iters`` > 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tetriserve.common.load import DecodeLoad, PrefillLoad, Role, same_load
from tetriserve.control_plane.handles import MemberSnapshot, SchedulerHandle, WorkerHandle
from tetriserve.decode_worker import slices

logger = logging.getLogger(__name__)
# the roles requests are placed on: they report a PrefillLoad and the GlobalScheduler gets their loads (a
# colocated worker runs the whole request; it gets no decode view, having no prefill to hand off)
PLACED_ON = (Role.PREFILL, Role.COLOCATED)


@dataclass
class _Member:
    worker_id: str
    role: Role
    handle: WorkerHandle
    address: str
    incarnation: int = 0
    load: PrefillLoad | DecodeLoad | None = None
    received: float = 0.0  # this monitor's clock (monotonic) at the latest report
    moved: float = 0.0  # ... when the engine's step counter last moved (or it had no work)
    dead: bool = False
    draining: bool = False
    known_decodes: frozenset[tuple[str, int]] = frozenset()  # prefill members: (decode, incarnation) announced


class ClusterMonitor:
    def __init__(
        self,
        report_interval_ms: int = 100,
        stale_after: int = 30,
        slice_lambda: float = 0.5,
        slice_min_interval_s: float = 1.0,
        slice_min_interval_iters: int = 0,
        stuck_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_interval_ms: int = 1000,
        report_tolerance: float = 0.0,
    ) -> None:
        self.interval = report_interval_ms / 1000
        self.heartbeat_s = heartbeat_interval_ms / 1000
        self.tolerance = report_tolerance
        self.stale_s = max(self.interval * stale_after, 3 * self.heartbeat_s)
        self.stuck_s = stuck_after_s
        self.clock = clock
        self.slice_lambda = slice_lambda
        self.slice_min_interval_s = slice_min_interval_s
        self.slice_min_interval_iters = slice_min_interval_iters  # eq. 12 Γ in decode steps; 0: in seconds
        self.members: dict[str, _Member] = {}
        self.scheduler: SchedulerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = True  # a load has changed since the last broadcast
        self._broadcast_serving: frozenset[tuple[str, int]] = frozenset()  # who was serving then
        self._broadcast_at = -float("inf")

    async def start(self, scheduler: SchedulerHandle) -> None:
        """Begin broadcasting (and rebalancing); called again with a re-created GlobalScheduler, it rewires."""
        self.scheduler = scheduler
        self._changed = True  # a re-created GlobalScheduler gets the loads at once
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._broadcast_loop()), asyncio.create_task(self._rebalance_loop())]

    async def sentinel(self) -> None:
        """Never returns: a call the supervisor keeps open, so this actor's death reaches it at once."""
        await asyncio.Event().wait()

    def register(
        self,
        worker_id: str,
        role: str,
        handle: WorkerHandle,
        address: str,
        incarnation: int = 0,
        load: PrefillLoad | DecodeLoad | None = None,
    ) -> None:
        """Add a worker, or its new life (which replaces the old one: new handle, new KV address), or the role
        it has flipped to (``load``: its first in that role, so it serves at once)."""
        old = self.members.get(worker_id)
        if old is not None and old.incarnation > incarnation:
            return
        self.members[worker_id] = _Member(worker_id, Role(role), handle, address, incarnation)
        if load is not None:
            self.report(load)

    def unregister(self, worker_id: str) -> None:
        """A worker removed for good (scaled in)."""
        if self.members.pop(worker_id, None) is not None:
            self.broadcast_once()

    def drain(self, worker_id: str, draining: bool = True) -> bool:
        """Leave ``worker_id`` out of placement and dispatch (or bring it back); False if it is unknown. Its
        reports still arrive, so its load shows when the drain is over."""
        member = self.members.get(worker_id)
        if member is None:
            return False
        member.draining = draining
        self.broadcast_once()
        return True

    def mark_dead(self, worker_id: str, incarnation: int) -> None:
        """The supervisor saw this life end, or a call got Ray's ``ActorDiedError`` from it (a front door's stream,
        a prefill worker's handoff): leave it out of every broadcast from now on."""
        member = self.members.get(worker_id)
        if member is not None and member.incarnation == incarnation:
            member.dead = True
            self.broadcast_once()

    def report(self, load: PrefillLoad | DecodeLoad) -> None:
        member = self.members.get(load.worker_id)
        if member is None or member.incarnation != load.incarnation or member.dead:
            return  # unknown, or a previous life's last words
        if isinstance(load, PrefillLoad) is not (member.role in PLACED_ON):
            return  # flipped in place, not yet registered in its new role
        now = self.clock()
        if member.load is None or not load.busy or load.steps != member.load.steps:
            member.moved = now
        self._changed = self._changed or not same_load(load, member.load, self.tolerance)
        member.load, member.received = load, now

    def _state(self, m: _Member, now: float) -> str:
        if m.dead:
            return "dead"
        if m.load is None:
            return "starting"
        if now - m.received > self.stale_s:
            return "stale"
        if now - m.moved > self.stuck_s:
            return "stuck"
        return "draining" if m.draining else "serving"

    def _serving(self, role: Role) -> list[_Member]:
        now = self.clock()
        return [m for m in self.members.values() if m.role is role and self._state(m, now) == "serving"]

    def _serving_now(self) -> frozenset[tuple[str, int]]:
        now = self.clock()
        members = self.members.values()
        return frozenset((m.worker_id, m.incarnation) for m in members if self._state(m, now) == "serving")

    def broadcast_due(self) -> bool:
        """Whether a load or the set of serving workers has changed since the last broadcast, or a heartbeat is
        due."""
        return (
            self._changed
            or self._serving_now() != self._broadcast_serving
            or self.clock() - self._broadcast_at >= self.heartbeat_s
        )

    async def _broadcast_loop(self) -> None:
        while True:
            try:
                if self.broadcast_due():
                    self.broadcast_once()
            except Exception:
                logger.exception("cluster monitor: broadcast failed")
            await asyncio.sleep(self.interval)

    def broadcast_once(self) -> None:
        self._changed, self._broadcast_serving, self._broadcast_at = False, self._serving_now(), self.clock()
        decode = self._serving(Role.DECODE)
        loads = [m.load for m in decode]
        ids = frozenset((m.worker_id, m.incarnation) for m in decode)
        for p in self._serving(Role.PREFILL):
            new = [m for m in decode if (m.worker_id, m.incarnation) not in p.known_decodes]
            addresses = {m.worker_id: m.address for m in new}
            handles = {m.worker_id: m.handle for m in new}
            p.handle.update_decode_view.remote(loads, addresses, handles)
            p.known_decodes = p.known_decodes | ids
        if self.scheduler is not None:
            placed = [m.load for role in PLACED_ON for m in self._serving(role)]
            self.scheduler.update_prefill_loads.remote(placed)

    async def _rebalance_loop(self) -> None:
        while True:
            wait = self.slice_min_interval_s
            try:
                wait = self.rebalance_once()
            except Exception:
                logger.exception("cluster monitor: slice rebalancing failed")
            await asyncio.sleep(wait)

    def rebalance_once(self) -> float:
        """One max-min round over the decode workers (SCLS §4.5); returns the time to the next (eq. 12)."""
        members = {m.worker_id: m for m in self._serving(Role.DECODE)}
        loads = [m.load for m in members.values() if isinstance(m.load, DecodeLoad)]
        if any(ld.slice_iters > 0 for ld in loads):
            for order in slices.plan(loads):
                dst = members[order.dst]
                members[order.src].handle.rebalance.remote(order, dst.address, dst.handle)
                logger.info(
                    "slices: %s (%.2f s of work) gives to %s (%.2f s)",
                    order.src,
                    order.src_load_s,
                    order.dst,
                    order.dst_load_s,
                )
        return slices.next_interval(loads, self.slice_lambda, self.slice_min_interval_s, self.slice_min_interval_iters)

    def snapshot(self) -> list[MemberSnapshot]:
        now = self.clock()
        return [
            {
                "worker_id": m.worker_id,
                "role": m.role.value,
                "state": self._state(m, now),
                "incarnation": m.incarnation,
                "address": m.address,
                "heartbeat_age_s": round(now - m.received, 3) if m.load is not None else None,
                "load": _load_dict(m.load),
            }
            for m in sorted(self.members.values(), key=lambda m: (m.role.value, m.worker_id))
        ]


def _load_dict(load: PrefillLoad | DecodeLoad | None) -> dict[str, float]:
    if load is None:
        return {}
    skip = ("at", "incarnation", "busy")
    out = {k: float(v) for k, v in vars(load).items() if isinstance(v, (int, float)) and k not in skip}
    out["age_ms"] = round((time.time() - load.at) * 1000, 1)
    return out
