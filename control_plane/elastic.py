"""The elastic controller: workers change role and count while streams run (TetriInfer §3.5, Figure 10).

    operator (admin gRPC Flip / Scale; `tetriserve flip`, `tetriserve scale`) ─┐
    flip policy (control_plane/flip, every ``flip.check_interval_s``) ─────────┴─▶ operations, one per worker:

    flip W to R   ACTIVE ─drain─▶ DRAINING ─(idle, or drain_timeout_s)─▶ FLIPPING: W swaps role ─(serving)─▶ ACTIVE
    remove W      ACTIVE ─drain─▶ DRAINING ─(idle, or drain_timeout_s)─▶ killed and forgotten
    add R         a new name R-k ─▶ STARTING (its engine loads) ─(serving)─▶ ACTIVE

Draining takes a worker out of placement and dispatch at once (the monitor's
``draining``: no new prompt is placed on a prefill worker, no KV is dispatched
to a decode worker) while what it holds finishes there. It is over when the
worker's reports have shown nothing queued or running for ``SETTLE_S`` (and at
least ``MIN_DRAIN_S`` passed, for a dispatch decided just before the drain to
land), or after ``flip.drain_timeout_s``: the requests still on the worker then
are migrated by their front doors with the tokens they have (the failure path).

A flip keeps the worker's actor and engine: the worker swaps its role in place
(``worker/actor.py``; TetriInfer's 5–7 ms switch), after ending
with ``retry`` errors whatever a timed-out drain left on it. Every flip's drain,
switch, engine-switch and first-request times are kept (``common/lifecycle.py``);
a flip the worker could not carry out puts it back in its old role.

Pure bookkeeping: the cluster's members come in as the monitor's snapshot
(``tick``), and what must happen goes out through an ``Actuator``
(``supervision.py`` over Ray; a fake in tests). Thread-safe: operators call in
from the front doors' event loop, ``tick`` runs on the supervision thread.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tetriserve.common.errors import InvalidRequestError
from tetriserve.common.flip_config import FlipConfig, ScaleConfig
from tetriserve.common.lifecycle import Lifecycle, LifecycleView, WorkerLifecycle
from tetriserve.common.load import Role
from tetriserve.control_plane.flip import Attainment, ClusterSnapshot, FlipOrder, FlipPolicy, ScaleOrder, WorkerView
from tetriserve.control_plane.flip.window import SloWindow
from tetriserve.control_plane.handles import MemberSnapshot

logger = logging.getLogger(__name__)

SETTLE_S = 0.5  # a draining worker idle this long (in its reports) is drained
MIN_DRAIN_S = 1.0  # ... and not before this: a dispatch decided just before the drain lands meanwhile
DECISIONS_KEPT = 100


class Actuator(Protocol):
    def drain(self, worker_id: str, draining: bool) -> None: ...
    def add_worker(self, name: str, role: str, now: float) -> None: ...
    def flip(self, name: str, role: str, now: float) -> None: ...
    def remove_worker(self, name: str) -> None: ...


class UnknownWorker(LookupError):
    """No worker has this name (gRPC NOT_FOUND)."""


@dataclass(frozen=True)
class Decision:
    """One order and what became of it, for ``status`` and the log."""

    at: float
    order: str  # "flip decode-1 prefill", "add prefill", "remove decode-2"
    source: str  # "operator" or "policy:<name>"
    reason: str
    outcome: str  # "started", or "done in 12.3 s", ...


@dataclass
class _Operation:
    kind: str  # flip | remove | add
    worker_id: str
    role: Role  # flip: the new role; add: its role; remove: its role
    order: str
    source: str
    started: float
    idle_since: float | None = None
    engine_switch_s: float | None = None  # flip: the worker's own timing of its role swap


class Elastic:
    def __init__(
        self,
        flip: FlipConfig,
        scale: ScaleConfig,
        actuator: Actuator,
        policy: FlipPolicy,
        slo: SloWindow | None = None,
    ) -> None:
        self.cfg, self.scale_cfg, self.actuator, self.policy = flip, scale, actuator, policy
        self.slo = slo
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self._lifecycles: dict[str, WorkerLifecycle] = {}
        self._ops: dict[str, _Operation] = {}
        self._members: dict[str, MemberSnapshot] = {}
        self._load: dict[str, tuple[float, float]] = {}  # worker -> (smoothed load, when)
        self._steps: dict[str, float] = {}  # worker -> its engine's step count in the last snapshot
        self._checked = -math.inf
        self._used: set[str] = set()  # every worker name seen
        self._removed: set[str] = set()  # workers removed (a snapshot taken before may still list one)
        self._lock = threading.RLock()

    # -- orders ----------------------------------------------------------------------------------
    def flip(self, worker_id: str, role: Role, now: float, source: str = "operator", reason: str = "by hand") -> str:
        """Start flipping ``worker_id`` to ``role``; a ValueError says why it cannot (``UnknownWorker``: no such
        worker)."""
        with self._lock:
            lc = self._ready(worker_id)
            if lc.role is role:
                raise ValueError(f"{worker_id} is a {role.value} worker already")
            self._check_floor(lc.role, leaving=1)
            self._drain(_Operation("flip", worker_id, role, f"flip {worker_id} {role.value}", source, now), lc, reason)
            return f"draining {worker_id} to flip it to {role.value}"

    def scale(
        self, counts: Mapping[Role, int], now: float, source: str = "operator", reason: str = "by hand"
    ) -> list[str]:
        """Add or remove workers until each role in ``counts`` has that many (removals drain first)."""
        with self._lock:
            for role, n in counts.items():
                if n < self._floor(role):
                    raise ValueError(
                        f"--{role.value} {n}: at least {self._floor(role)} {role.value} worker(s) must stay"
                    )
            said = []
            for role, n in counts.items():
                have = len(self._headed_for(role))
                said += [self._add(role, now, source, reason) for _ in range(n - have)]
                removable = self._removable(role)[: max(have - n, 0)]
                said += [self._remove(wid, now, source, reason) for wid in removable]
                if have - n > len(removable):
                    said.append(f"{role.value}: {have - n - len(removable)} more to remove once their operations end")
            return said or ["nothing to do: the counts are already so"]

    def _add(self, role: Role, now: float, source: str, reason: str) -> str:
        name = self._new_name(role)
        self._lifecycles[name] = WorkerLifecycle(name, role)
        self._start(_Operation("add", name, role, f"add {name}", source, now), reason)
        self.actuator.add_worker(name, role.value, now)
        return f"adding {name}"

    def _remove(self, worker_id: str, now: float, source: str, reason: str) -> str:
        lc = self._ready(worker_id)
        self._check_floor(lc.role, leaving=1)
        self._drain(_Operation("remove", worker_id, lc.role, f"remove {worker_id}", source, now), lc, reason)
        return f"draining {worker_id} to remove it"

    def _drain(self, op: _Operation, lc: WorkerLifecycle, reason: str) -> None:
        lc.drain(op.role if op.kind == "flip" else None, op.started)
        self._start(op, reason)
        self.actuator.drain(op.worker_id, True)

    def _start(self, op: _Operation, reason: str) -> None:
        self._ops[op.worker_id] = op
        self._decide(op, reason, "started", op.started)

    def _decide(self, op: _Operation, reason: str, outcome: str, now: float) -> None:
        self.decisions.append(Decision(now, op.order, op.source, reason, outcome))
        logger.info("elastic: %s (%s; %s): %s", op.order, op.source, reason, outcome)

    # -- the tick ------------------------------------------------------------------------------------
    def tick(self, members: Sequence[MemberSnapshot], now: float) -> None:
        """The monitor's latest snapshot: move every operation on, then let the policy look."""
        with self._lock:
            self._members = {m["worker_id"]: m for m in members if m["worker_id"] not in self._removed}
            for wid, m in self._members.items():
                lc = self._lifecycles.get(wid)
                if lc is None:
                    state = Lifecycle.STARTING if m["state"] == "starting" else Lifecycle.ACTIVE
                    lc = self._lifecycles[wid] = WorkerLifecycle(wid, Role(m["role"]), state)
                self._smooth(wid, m, now)
                if lc.state is Lifecycle.STARTING and wid not in self._ops and m["state"] == "serving":
                    lc.activate(now)
                steps = float((m.get("load") or {}).get("steps", 0))
                stepped = steps > self._steps.get(wid, steps)  # served something since the last snapshot
                self._steps[wid] = steps
                if lc.state is Lifecycle.ACTIVE and (_busy(m) or stepped):
                    lc.served(now)
            for op in list(self._ops.values()):
                self._advance(op, now)
            if now - self._checked >= self.cfg.check_interval_s:
                self._checked = now
                self._consult_policy(now)

    def _advance(self, op: _Operation, now: float) -> None:
        lc, m = self._lifecycles[op.worker_id], self._members.get(op.worker_id)
        if lc.state is Lifecycle.DRAINING:
            idle = m is None or m["state"] == "dead" or not _busy(m)
            op.idle_since = (op.idle_since if op.idle_since is not None else now) if idle else None
            settled = op.idle_since is not None and now - op.idle_since >= SETTLE_S and now - op.started >= MIN_DRAIN_S
            timed_out = now - op.started >= self.cfg.drain_timeout_s
            if not (settled or timed_out):
                return
            why = "drained" if settled else f"drain timed out after {self.cfg.drain_timeout_s:g} s"
            if op.kind == "remove":
                self.actuator.remove_worker(op.worker_id)
                self._removed.add(op.worker_id)
                lc.die()
                del self._lifecycles[op.worker_id], self._ops[op.worker_id]
                self._load.pop(op.worker_id, None)
                self._steps.pop(op.worker_id, None)
                self._decide(op, why, f"removed after {now - op.started:.1f} s", now)
                return
            lc.flipping(now)
            self.actuator.flip(op.worker_id, op.role.value, now)
            self._decide(op, why, f"switching to {op.role.value}", now)
        elif m is not None and m["state"] == "serving" and Role(m["role"]) is op.role:
            lc.activate(now, op.engine_switch_s)
            del self._ops[op.worker_id]
            timing = lc.last_flip
            done = f"done in {now - op.started:.1f} s"
            if timing is not None and op.kind == "flip":
                done += f" (drain {timing.drain_s:.1f} s, switch {timing.switch_s:.2f} s"
                if timing.engine_switch_s is not None:
                    done += f", on the engine {timing.engine_switch_s * 1e3:.1f} ms"
                done += ")"
            self._decide(op, "serving", done, now)

    def flipped(self, worker_id: str, engine_switch_s: float) -> None:
        """The worker has swapped its role (its first report in the new role completes the flip)."""
        with self._lock:
            op = self._ops.get(worker_id)
            if op is not None and op.kind == "flip":
                op.engine_switch_s = engine_switch_s

    def flip_failed(self, worker_id: str, now: float, reason: str) -> None:
        """The worker could not swap its role and serves in its old one: back to ACTIVE, placeable again."""
        with self._lock:
            op, lc = self._ops.get(worker_id), self._lifecycles.get(worker_id)
            if op is None or op.kind != "flip" or lc is None or lc.state is not Lifecycle.FLIPPING:
                return
            lc.cancel()
            del self._ops[worker_id]
            self.actuator.drain(worker_id, False)
            self._decide(op, reason, "failed: serving in its old role", now)

    def _consult_policy(self, now: float) -> None:
        snapshot = ClusterSnapshot(
            now,
            tuple(self._view_for_policy(wid, lc) for wid, lc in sorted(self._lifecycles.items())),
            self.slo.attainment(now) if self.slo is not None else Attainment(),
            self.scale_cfg.max_workers,
        )
        source = f"policy:{self.policy.name}"
        for order in self.policy.decide(snapshot):
            try:
                if isinstance(order, FlipOrder):
                    self.flip(order.worker_id, order.to_role, now, source, order.reason)
                elif isinstance(order, ScaleOrder):
                    self._add(order.role, now, source, order.reason)
                else:
                    self._remove(order.worker_id, now, source, order.reason)
            except ValueError as exc:
                logger.info("elastic: %s order not carried out: %s", source, exc)

    def _view_for_policy(self, wid: str, lc: WorkerLifecycle) -> WorkerView:
        m = self._members.get(wid, {})
        state = lc.state
        if state is Lifecycle.ACTIVE and m.get("state") != "serving":  # down or restarting: not settled
            state = Lifecycle.STARTING
        load = m.get("load") or {}
        return WorkerView(
            wid,
            lc.role,
            state,
            self._load.get(wid, (0.0, 0.0))[0],
            int(load.get("queued", 0)),
            int(load.get("running", 0)),
        )

    def _smooth(self, wid: str, m: MemberSnapshot, now: float) -> None:
        """Each worker's load: the share of time its engine had work (queued or running requests), smoothed
        with time constant ``flip.load_window_s`` — for a decode worker as for a prefill one, since a decode
        engine with one request steps as often as with many."""
        instant = 1.0 if _busy(m) else 0.0
        prior = self._load.get(wid)
        if prior is None:
            self._load[wid] = (instant, now)
            return
        alpha = 1.0 - math.exp(-max(now - prior[1], 0.0) / self.cfg.load_window_s)
        self._load[wid] = (prior[0] + alpha * (instant - prior[0]), now)

    def use(self, policy: FlipPolicy) -> None:
        """Decide with ``policy`` from now on (its idle clocks start afresh)."""
        with self._lock:
            self.policy = policy
            self._checked = -math.inf

    # -- views -----------------------------------------------------------------------------------------
    def lifecycles(self) -> dict[str, LifecycleView]:
        with self._lock:
            return {wid: lc.view() for wid, lc in self._lifecycles.items()}

    # -- helpers ---------------------------------------------------------------------------------------
    def _ready(self, worker_id: str) -> WorkerLifecycle:
        lc = self._lifecycles.get(worker_id)
        if lc is None:
            raise UnknownWorker(f"unknown worker {worker_id!r}; known: {', '.join(sorted(self._lifecycles))}")
        if worker_id in self._ops:
            raise ValueError(f"{worker_id} is busy: {self._ops[worker_id].order} is under way")
        if lc.state is not Lifecycle.ACTIVE or self._members.get(worker_id, {}).get("state") != "serving":
            raise ValueError(f"{worker_id} is not serving now; try again once it is")
        return lc

    def _floor(self, role: Role) -> int:
        return int(self.cfg.min_prefill if role is Role.PREFILL else self.cfg.min_decode)

    def _check_floor(self, role: Role, leaving: int) -> None:
        active = [lc for wid, lc in self._lifecycles.items() if lc.role is role and lc.state is Lifecycle.ACTIVE]
        if len(active) - leaving < self._floor(role):
            raise ValueError(f"at least {self._floor(role)} {role.value} worker(s) must keep serving")

    def _headed_for(self, role: Role) -> list[str]:
        """Workers that serve ``role`` or soon will (starting, flipping to it), less those being removed."""
        out = []
        for wid, lc in self._lifecycles.items():
            if lc.state is Lifecycle.DEAD or lc.removing:
                continue
            if (lc.target_role or lc.role) is role:
                out.append(wid)
        return out

    def _removable(self, role: Role) -> list[str]:
        """ACTIVE ``role`` workers with no operation, least loaded first (then the newest name)."""
        ready = [
            wid
            for wid, lc in self._lifecycles.items()
            if lc.role is role and lc.state is Lifecycle.ACTIVE and wid not in self._ops
        ]
        return sorted(ready, key=lambda w: (self._load.get(w, (0.0, 0.0))[0], _index_desc(w)))

    def _new_name(self, role: Role) -> str:
        """The lowest ``<role>-k`` never used in this service's life: a name is not reused, because the front
        doors and the monitor tell a worker's lives apart by incarnation, and a new actor starts from 0."""
        self._used |= set(self._lifecycles) | set(self._members)
        k = 0
        while f"{role.value}-{k}" in self._used:
            k += 1
        self._used.add(f"{role.value}-{k}")
        return f"{role.value}-{k}"


def role_counts(prefill: int | None, decode: int | None) -> dict[Role, int]:
    """A ``scale`` order's counts (None: leave that role as it is)."""
    return {r: n for r, n in ((Role.PREFILL, prefill), (Role.DECODE, decode)) if n is not None}


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise InvalidRequestError("role", f"must be 'prefill' or 'decode', got {value!r}") from None


def _busy(m: MemberSnapshot) -> bool:
    load = m.get("load") or {}
    return bool(load.get("queued", 0) > 0 or load.get("running", 0) > 0)


def _index_desc(worker_id: str) -> int:
    tail = worker_id.rsplit("-", 1)[-1]
    return -int(tail) if tail.isdigit() else 0
