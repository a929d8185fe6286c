"""Supervision over Ray (``docs/design/ownership.md``): watch every named actor, re-create the dead under the same name.

A daemon thread of the ``control-plane`` actor, which launched the cluster, ticks every ``TICK_S``::

    death      each actor has one ``sentinel()`` call open; Ray fails it the moment the actor dies
               (ray.kill, SIGKILL of its process, its node gone once Ray's health check says so)
    health     the ClusterMonitor's snapshot (heartbeats judged by its clock: stale, stuck engine) and a
               ping of the monitor and the GlobalScheduler; unhealthy for ``dead_after_s`` ─▶ ray.kill
    restart    ``supervisor.Supervisor`` says who is due ─▶ ``ActorBuilder`` builds the next incarnation ─▶
               worker: start(monitor, scheduler) resolves once its engine is up ─▶ monitor.register (the
               prefill workers hear of a decode worker's new KV address with the next broadcast),
               GlobalScheduler.set_prefill, the cluster's handle replaced (front doors reopen their streams)
               scheduler / monitor: rewired into the monitor and every worker

Scaling and flips (``elastic.py``) go through here too, on the same thread:
``add_worker`` builds a new name's first life the way a restart builds the next,
``flip`` has a drained worker swap its role in place (``Worker.flip``; once it
has, the worker moves between the cluster's tables and is registered with the
monitor in its new role), ``remove_worker`` kills a drained worker for good and
takes it out of the monitor and the GlobalScheduler.

Once a second the same thread publishes each worker's role, lifecycle and
flips as Ray metrics (``observability/worker_gauges.py``), which is how the Ray dashboard
shows them.

The bookkeeping and its decisions are ``supervisor.py`` (pure, unit-tested);
this file only talks to Ray.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tetriserve.common.lifecycle import Lifecycle
from tetriserve.control_plane.elastic import Elastic
from tetriserve.control_plane.flip import policy_from_config
from tetriserve.control_plane.handles import (
    ActorRef,
    MemberSnapshot,
    MonitorHandle,
    SchedulerHandle,
    SchedulerStatus,
    WorkerHandle,
    kill,
)
from tetriserve.control_plane.supervisor import ActorState, Slot, Supervisor
from tetriserve.observability.worker_gauges import RayGauges, gauge_values

if TYPE_CHECKING:
    from ray import ObjectRef

    from tetriserve.common.load import DecodeLoad, PrefillLoad
    from tetriserve.control_plane.launcher import ActorBuilder, Cluster
    from tetriserve.worker.actor import FlipResult

logger = logging.getLogger(__name__)

TICK_S = 0.25
PING_TIMEOUT_S = 2.0
GAUGE_INTERVAL_S = 1.0
START_TIMEOUT_S = 600.0  # a worker's engine start (model load, profiling) may take minutes on real models

SCHEDULER = "global-scheduler"
MONITOR = "cluster-monitor"
WORKER_ROLES = ("prefill", "decode", "colocated")  # slots that hold a worker actor


@dataclass(frozen=True)
class _Starting:
    """A life being built: ``ready`` resolves once it serves, then ``install`` puts it in place with what
    ``ready`` gave."""

    incarnation: int
    handle: ActorRef
    ready: ObjectRef[str] | ObjectRef[SchedulerStatus] | ObjectRef[list[MemberSnapshot]]
    since: float
    install: Callable[[object], None]
    worker: WorkerHandle | None = None  # the worker's own handle (None: the scheduler's or the monitor's life)


class Supervision:
    def __init__(self, cluster: Cluster, build: ActorBuilder, addresses: dict[str, str]) -> None:
        self.cluster = cluster
        self.build = build
        self.addresses = dict(addresses)  # worker -> KV address of its current life
        placed = "colocated" if cluster.config.mode == "colocated" else "prefill"  # the workers placed on
        actors = [(w, placed) for w in cluster.prefill] + [(w, "decode") for w in cluster.decode]
        actors += [(SCHEDULER, "scheduler"), (MONITOR, "monitor")]
        now = time.monotonic()
        self.sup = Supervisor(actors, dead_after_s=cluster.config.dead_after_s, now=now)
        for name in (SCHEDULER, MONITOR):
            self.sup.health(name, 0, "serving", now)
        self._sentinels: dict[ObjectRef[None], tuple[str, int]] = {}  # ref -> (name, incarnation)
        self._armed: set[tuple[str, int]] = set()
        self._pending: dict[str, _Starting] = {}
        self._flips: dict[str, tuple[str, str, ObjectRef[FlipResult]]] = {}  # name -> (old role, new role, its call)
        self._gauges: RayGauges | None = RayGauges()  # the workers' roles and flips for the Ray dashboard
        self._gauged = -float("inf")
        cfg = cluster.config
        self.elastic = Elastic(
            cfg.flip,
            cfg.scale,
            self,
            policy_from_config(cfg.flip, base_workers=cfg.num_prefill + cfg.num_decode),
            cluster.slo,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervision", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def view(self) -> list[Slot]:
        return self.sup.view()

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick(time.monotonic())
            except Exception:  # the supervisor must outlive any one bad tick
                logger.exception("supervision: tick failed")

    def _tick(self, now: float) -> None:
        self._arm()
        self._reap(now)
        self._check_flips(now)  # before the health check: a flipped worker then shows in its new role this tick
        members = self._check_health(now)
        if members is not None:
            self.elastic.tick(members, now)
        for slot in self.sup.due(now):
            self._rebuild(slot, now)
        self._check_pending(now)
        if now - self._gauged >= GAUGE_INTERVAL_S and self._gauges is not None:
            self._gauged = now
            lives = {slot.name: slot.incarnation for slot in self.sup.view()}
            try:
                self._gauges.publish(gauge_values(self.elastic.lifecycles(), lives))
            except Exception:  # no metrics agent: the dashboard goes without, the service does not
                logger.exception("supervision: worker gauges are off")
                self._gauges = None

    def handle(self, name: str) -> ActorRef | None:
        if name == SCHEDULER:
            return self.cluster.scheduler
        if name == MONITOR:
            return self.cluster.monitor
        return self._worker(name)

    def _worker(self, name: str) -> WorkerHandle | None:
        return self.cluster.prefill.get(name) or self.cluster.decode.get(name)

    # -- scaling and flips: the elastic controller's actuator (called on this thread, from its tick) -----------
    def drain(self, worker_id: str, draining: bool) -> None:
        _quietly(lambda: self.cluster.monitor.drain.remote(worker_id, draining))

    def add_worker(self, name: str, role: str, now: float) -> None:
        self.sup.add(name, role, now)

    def flip(self, name: str, role: str, now: float) -> None:
        """Have the drained worker ``name`` serve ``role`` with the engine it has."""
        handle = self._worker(name)
        old = self.sup.slots[name].role
        self.sup.relabel(name, role)  # should it die now, its next life is built in the new role
        try:
            if handle is None:
                raise LookupError(f"no handle for {name}")
            self._flips[name] = (old, role, handle.flip.remote(role, self.cluster.config.flip.drain_timeout_s))
        except Exception as exc:
            self.sup.relabel(name, old)
            self.elastic.flip_failed(name, now, f"flip call failed: {exc}")

    def _check_flips(self, now: float) -> None:
        import ray

        for name, (old, role, ref) in list(self._flips.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            del self._flips[name]
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:  # it died: its sentinel says so, its next life serves ``role``
                continue
            except Exception as exc:  # alive in its old role (still busy, a bug): the flip is off
                logger.warning("supervision: %s did not flip to %s: %s", name, role, exc)
                if name in self.sup.slots:
                    self.sup.relabel(name, old)
                self.elastic.flip_failed(name, now, f"{type(exc).__name__}: {exc}")
                continue
            slot, handle = self.sup.slots.get(name), self._worker(name)
            if slot is None or handle is None:  # removed meanwhile
                continue
            self._place(name, role, handle, slot.incarnation, result.load)  # serving at once, with it
            self.elastic.flipped(name, result.switch_ms / 1e3)
            logger.warning("supervision: %s serves %s now (%s)", name, role, result)

    def remove_worker(self, name: str) -> None:
        """Kill the drained worker ``name`` for good."""
        handle = self.handle(name)
        self.sup.remove(name)
        self._forget(name)
        self.addresses.pop(name, None)
        _quietly(lambda: self.cluster.monitor.unregister.remote(name))
        if handle is not None:
            _quietly(lambda: kill(handle, no_restart=True))

    def _forget(self, name: str) -> None:
        """Take ``name`` out of the cluster's worker tables (front doors stop streaming from it) and out of
        placement."""
        c = self.cluster
        if name in c.prefill:
            _quietly(lambda: c.scheduler.remove_prefill.remote(name))
        # new dicts, not mutated ones: the front doors' event loop reads these tables from another thread
        c.prefill = {k: v for k, v in c.prefill.items() if k != name}
        c.decode = {k: v for k, v in c.decode.items() if k != name}

    def _arm(self) -> None:
        """One open ``sentinel`` call per live actor."""
        for slot in self.sup.view():
            key = (slot.name, slot.incarnation)
            if slot.state in (ActorState.ACTIVE, ActorState.STARTING) and key not in self._armed:
                handle = self.handle(slot.name)
                if handle is None:
                    raise LookupError(f"no handle for {slot.name}")
                self._sentinels[handle.sentinel.remote()] = key
                self._armed.add(key)

    def _reap(self, now: float) -> None:
        import ray

        if not self._sentinels:
            return
        ready, _ = ray.wait(list(self._sentinels), num_returns=len(self._sentinels), timeout=0)
        for ref in ready:
            name, incarnation = self._sentinels.pop(ref)
            self._armed.discard((name, incarnation))
            try:
                ray.get(ref)
                reason = "its sentinel call returned"
            except Exception as exc:
                reason = type(exc).__name__
            self._died(name, incarnation, now, reason)

    def _died(self, name: str, incarnation: int, now: float, reason: str) -> None:
        if not self.sup.died(name, incarnation, now, reason):
            return
        logger.warning("supervision: %s (incarnation %d) died: %s", name, incarnation, reason)
        if name not in (SCHEDULER, MONITOR):
            _quietly(lambda: self.cluster.monitor.mark_dead.remote(name, incarnation))

    def _check_health(self, now: float) -> list[MemberSnapshot] | None:
        """Ping the control actors and judge the workers by the monitor's snapshot (returned; None if the
        monitor did not answer)."""
        import ray

        members = None
        for name in (SCHEDULER, MONITOR):
            slot = self.sup.slots[name]
            try:
                if name == SCHEDULER:
                    ray.get(self.cluster.scheduler.status.remote(), timeout=PING_TIMEOUT_S)
                else:
                    members = ray.get(self.cluster.monitor.snapshot.remote(), timeout=PING_TIMEOUT_S)
                state = "serving"
            except Exception:
                state = "stale"
            if self.sup.health(name, slot.incarnation, state, now):
                self._kill(name, f"no answer for {self.sup.dead_after_s:.0f} s")
            if name == MONITOR and members is not None:
                for member in members:
                    if self.sup.health(member["worker_id"], member["incarnation"], member["state"], now):
                        self._kill(member["worker_id"], f"{member['state']} for {self.sup.dead_after_s:.0f} s")
        return members

    def _kill(self, name: str, why: str) -> None:
        logger.warning("supervision: killing %s: %s", name, why)
        _quietly(lambda: kill(self.handle(name), no_restart=True))  # its sentinel then reports the death

    # -- re-creating ----------------------------------------------------------------------------
    def _rebuild(self, slot: Slot, now: float) -> None:
        name, inc = slot.name, slot.incarnation
        _quietly(lambda: kill(self.handle(name), no_restart=True))  # make sure the old life is gone
        try:
            if slot.role in WORKER_ROLES:
                worker = self.build.worker(name, slot.role, inc)
            elif slot.role == "scheduler":
                scheduler = self.build.scheduler(self.cluster.prefill)
            else:
                monitor = self.build.monitor()
        except Exception as exc:  # e.g. the name is still held by the dying actor: try again after a backoff
            logger.warning("supervision: could not create %s: %s", name, exc)
            self.sup.start_failed(name, inc, now, str(exc))
            return
        if slot.role in WORKER_ROLES:  # resolves once its engine is up
            ready = worker.start.remote(self.cluster.monitor, self.cluster.scheduler)
            install = self._install_worker(name, inc, worker)
            self._pending[name] = _Starting(inc, worker, ready, now, install, worker)
        elif slot.role == "scheduler":
            ready_s = scheduler.status.remote()
            self._pending[name] = _Starting(inc, scheduler, ready_s, now, self._install_scheduler(scheduler))
        else:
            ready_m = monitor.snapshot.remote()
            self._pending[name] = _Starting(inc, monitor, ready_m, now, self._install_monitor(monitor))
        logger.warning("supervision: re-creating %s as incarnation %d", name, inc)

    def _check_pending(self, now: float) -> None:
        import ray

        for name, starting in list(self._pending.items()):
            inc, handle, ref, since = starting.incarnation, starting.handle, starting.ready, starting.since
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                if now - since > START_TIMEOUT_S:
                    del self._pending[name]
                    _quietly(functools.partial(kill, handle, no_restart=True))
                    self.sup.start_failed(name, inc, now, "start timed out")
                continue
            del self._pending[name]
            if name not in self.sup.slots:  # removed while it started
                _quietly(functools.partial(kill, handle, no_restart=True))
                continue
            try:
                result = ray.get(ref)
            except Exception as exc:
                logger.error("supervision: %s (incarnation %d) failed to start: %s", name, inc, exc)
                _quietly(functools.partial(kill, handle, no_restart=True))
                self.sup.start_failed(name, inc, now, type(exc).__name__)
                continue
            starting.install(result)  # the new life in place; everyone who needs its handle or address told
            logger.warning("supervision: %s is back (incarnation %d)", name, inc)
            self.sup.started(name, inc, now)

    def _install_scheduler(self, handle: SchedulerHandle) -> Callable[[object], None]:
        def install(_: object) -> None:
            self.cluster.scheduler = handle
            self._rewire()

        return install

    def _install_monitor(self, handle: MonitorHandle) -> Callable[[object], None]:
        def install(_: object) -> None:
            self.cluster.monitor = handle

            def register(args: tuple[str, str, WorkerHandle | None, str, int]) -> None:
                handle.register.remote(*args)

            def drain(worker_id: str) -> None:
                handle.drain.remote(worker_id, True)

            for slot in self.sup.view():
                if slot.role in WORKER_ROLES and slot.state in (ActorState.ACTIVE, ActorState.STARTING):
                    args = (slot.name, slot.role, self._worker(slot.name), self.addresses[slot.name], slot.incarnation)
                    _quietly(functools.partial(register, args))
            for wid, life in self.elastic.lifecycles().items():  # a new monitor knows nothing of drains
                if life.state is Lifecycle.DRAINING:
                    _quietly(functools.partial(drain, wid))
            self._rewire()

        return install

    def _install_worker(self, name: str, inc: int, handle: WorkerHandle) -> Callable[[object], None]:
        def install(address: object) -> None:
            self.addresses[name] = str(address)
            self._place(name, self.sup.slots[name].role, handle, inc)

        return install

    def _place(
        self, name: str, role: str, handle: WorkerHandle, inc: int, load: PrefillLoad | DecodeLoad | None = None
    ) -> None:
        """Put worker ``name`` in its role's table (out of the other's: its life may have been built in the
        other role, or flipped) and register it with the monitor in that role (``load``: its first there)."""
        c = self.cluster
        if role in ("prefill", "colocated"):  # the workers requests are placed on
            c.decode = {k: v for k, v in c.decode.items() if k != name}
            c.prefill = {**c.prefill, name: handle}
            _quietly(lambda: c.scheduler.set_prefill.remote(name, handle))
        else:
            self._forget(name)
            c.decode = {**c.decode, name: handle}
        _quietly(lambda: c.monitor.register.remote(name, role, handle, self.addresses[name], inc, load))

    def _rewire(self) -> None:
        """Point the monitor and every worker (those still starting too) at the current control actors."""
        c = self.cluster
        _quietly(lambda: c.monitor.start.remote(c.scheduler))
        starting = [s.worker for s in self._pending.values() if s.worker is not None]

        def start(worker: WorkerHandle) -> None:
            worker.start.remote(c.monitor, c.scheduler)

        for worker in [*c.prefill.values(), *c.decode.values(), *starting]:
            _quietly(functools.partial(start, worker))


def _quietly(call: Callable[[], object]) -> None:
    """Fire and forget: an actor call whose failure the sentinels and health checks report anyway."""
    try:
        call()
    except Exception as exc:
        logger.debug("supervision: call failed: %s", exc)
