"""The admin client over a launched Ray cluster (``AdminClient``): health, status, flips, scaling, policies.

``status`` asks every worker actor for its policies in parallel, each with a
deadline, so a stuck worker shows an empty policy instead of hanging the call;
``set_policy`` checks the change (``policy_admin``) before any actor sees it and
calls the targeted workers' ``set_policy`` (prefill or decode, by the target's role).
Flips and scaling go to the control plane's elastic controller (``control_plane/elastic.py``). The request path
of the same cluster is ``RayBackend`` (``frontdoor/ray_backend.py``).
"""

from __future__ import annotations

import asyncio
import logging

from tetriserve.common.errors import actor_died
from tetriserve.common.lifecycle import Lifecycle
from tetriserve.control_plane.handles import WorkerHandle
from tetriserve.frontdoor.backend import ClusterStatus, WorkerPolicy, WorkerStatus, lifecycle_fields
from tetriserve.frontdoor.cluster_handles import ClusterHandles, Control
from tetriserve.frontdoor.policy_admin import actor_setter, apply_changes, parse_changes, resolve_targets
from tetriserve.frontdoor.ray_backend import control_of, worker_handles
from tetriserve.transport.registry import backend_of

logger = logging.getLogger(__name__)

POLICIES_TIMEOUT_S = 2.0  # status: a worker that does not answer by then shows no policy
STATS_TIMEOUT_S = 4.0  # worker_stats (the metrics exporter's, which waits 5 s for the whole cluster)


class RayAdmin:
    """``AdminClient`` over a launched ``Cluster`` or a ``RemoteCluster`` (the detached control plane's)."""

    def __init__(self, cluster: ClusterHandles, model_name: str) -> None:
        self.cluster = cluster
        self._model_name = model_name

    async def healthy(self) -> bool:
        """Serving: the GlobalScheduler answers and at least one prefill and one decode worker serve, or (the
        colocated mode) one colocated worker."""
        try:
            await asyncio.wait_for(self.cluster.scheduler.status.remote(), timeout=5)
            members = await asyncio.wait_for(self.cluster.monitor.snapshot.remote(), timeout=5)
        except Exception:
            return False
        serving = {m["role"] for m in members if m["state"] == "serving"}
        return serving >= {"prefill", "decode"} or "colocated" in serving

    async def status(self) -> ClusterStatus:
        members, sched, policies = await asyncio.gather(
            self.cluster.monitor.snapshot.remote(), self.cluster.scheduler.status.remote(), self._policies()
        )
        control = control_of(self.cluster)
        state = await control.supervision_state() if control is not None else None
        slots, lives = (state.slots, state.lives) if state is not None else ({}, {})
        seen = {m["worker_id"] for m in members}
        members += [  # added, and not registered with the monitor yet: their engines are loading
            {"worker_id": w, "role": lc.role.value, "state": "starting", "load": {}}
            for w, lc in lives.items()
            if w not in seen and lc.state is Lifecycle.STARTING
        ]
        workers = []
        for m in members:
            wid = m["worker_id"]
            slot = slots.get(wid)
            workers.append(
                WorkerStatus(
                    wid,
                    m["role"],
                    slot.state.value if slot is not None else m["state"],
                    m["load"],
                    policies.get(wid, {}),
                    incarnation=slot.incarnation if slot is not None else int(m.get("incarnation", 0)),
                    restarts=slot.restarts if slot is not None else 0,
                    health=m["state"],
                    transport=backend_of(m["address"]) if m.get("address") else "",
                    **lifecycle_fields(lives.get(wid)),
                )
            )
        config = self.cluster.config
        return ClusterStatus(
            self._model_name,
            tuple(workers),
            int(sched["in_flight"]),
            self.cluster.dashboard_url,
            preset=config.preset or "",
            mode=config.mode,
        )

    async def worker_stats(self) -> dict[str, dict[str, object]]:
        """Every worker's ``stats()`` (engine, transport, length scores), asked in parallel; one that fails or is
        late is left out (the metrics exporter's per-worker figures)."""
        handles = worker_handles(self.cluster)

        async def one(handle: WorkerHandle) -> dict[str, object] | None:
            try:
                return dict(await asyncio.wait_for(handle.stats.remote(), STATS_TIMEOUT_S))
            except Exception:
                return None

        answers = await asyncio.gather(*(one(h) for h in handles.values()))
        return {wid: a for wid, a in zip(handles, answers, strict=True) if a is not None}

    async def scheduler_counts(self) -> dict[str, int]:
        """The GlobalScheduler's request counts since it started (admitted, finished, aborted, errors, moved,
        refused), and its prefix placement's (placed_by_prefix, prefix_hit_tokens)."""
        sched = await asyncio.wait_for(self.cluster.scheduler.status.remote(), POLICIES_TIMEOUT_S)
        return {k: int(v) for k, v in {**sched["counts"], **sched.get("placements", {})}.items()}

    async def _policies(self) -> dict[str, dict[str, str]]:
        """Every worker's ``policies()``, asked in parallel; ``{}`` for one that fails or is late."""
        handles = worker_handles(self.cluster)

        async def one(worker_id: str, handle: WorkerHandle) -> dict[str, str]:
            try:
                return dict(await asyncio.wait_for(handle.policies.remote(), POLICIES_TIMEOUT_S))
            except Exception as exc:  # a dead one's death and restart are the supervisor's to report
                log = logger.debug if actor_died(exc) else logger.warning
                log("status: no policies from %s (%s: %s)", worker_id, type(exc).__name__, str(exc).split("\n")[0])
                return {}

        answers = await asyncio.gather(*(one(wid, h) for wid, h in handles.items()))
        return dict(zip(handles, answers, strict=True))

    async def flip(self, worker_id: str, role: str) -> str:
        return str(await self._elastic().flip(worker_id, role))

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return list(await self._elastic().scale(prefill, decode))

    def _elastic(self) -> Control:
        control = control_of(self.cluster)
        if control is None:
            raise ValueError("flips and scaling need the supervisor (config: supervise: true)")
        return control

    async def set_policy(self, worker_id: str | None, changes: dict[str, str]) -> list[WorkerPolicy]:
        colocated = self.cluster.config.mode == "colocated"
        role, targets = resolve_targets(worker_id, self.cluster.prefill, self.cluster.decode, colocated)
        parsed = parse_changes(role, changes)
        return await apply_changes({wid: actor_setter(h) for wid, h in targets.items()}, parsed, role)
