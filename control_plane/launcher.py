"""The one place that builds the cluster's Ray actors and wires them together.

    ray.init (local, or --address) ─▶ ClusterMonitor  "cluster-monitor"
                                    ─▶ Worker          "decode-0..N"    (engines start in parallel)
                                    ─▶ Worker          "prefill-0..M"   (+ its length predictor, factory.py)
                                       one engine each, in the role its name says until a flip (worker/actor.py)
                                    ─▶ GlobalScheduler "global-scheduler"
    then: workers register with the monitor, start their 100 ms load reports (and state
    events to the GlobalScheduler), and the monitor starts broadcasting. Front doors
    open their streams to the workers themselves (``ray_backend``).

    then (``supervise``): the supervisor watches every actor and re-creates the dead (``supervision.py``).

Worker modules stay Ray-free: the classes are wrapped with ``ray.remote`` here
(``ActorBuilder``, which the supervisor also uses). Every actor is named (in
the config's namespace) so the Ray dashboard shows who is who, and reserves no
CPU (``num_cpus=0``) so a 2-core machine can hold the whole cluster; engine
threads are bounded by ``threads_per_engine`` instead. Actors have no Ray
``max_restarts``: Ray would re-run a dead actor's constructor with its old
arguments (its old incarnation) and nobody would re-register it, and
``ray.kill`` forbids that restart anyway; the supervisor re-creates it instead.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tetriserve.common.config import ClusterConfig
from tetriserve.control_plane.cluster_monitor import ClusterMonitor
from tetriserve.control_plane.control_plane import SupervisionState
from tetriserve.control_plane.elastic import Elastic, parse_role, role_counts
from tetriserve.control_plane.flip.window import SloWindow
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.control_plane.handles import (
    MonitorHandle,
    SchedulerHandle,
    WorkerHandle,
    kill,
    typed_monitor,
    typed_scheduler,
    typed_worker,
)
from tetriserve.engine.settings import engine_env
from tetriserve.length_predictor.factory import build_predictor
from tetriserve.worker.actor import Worker

if TYPE_CHECKING:
    from tetriserve.control_plane.supervision import Supervision

logger = logging.getLogger(__name__)


@dataclass
class Cluster:
    config: ClusterConfig
    model_path: str
    scheduler: SchedulerHandle
    monitor: MonitorHandle
    prefill: dict[str, WorkerHandle]
    decode: dict[str, WorkerHandle]
    dashboard_url: str = ""
    owns_ray: bool = False
    started_at: float = field(default_factory=time.time)
    supervision: Supervision | None = None  # while it runs
    slo: SloWindow | None = None  # finished requests' TTFT / TPOT against their objectives (the slo flip policy)

    def shutdown(self, leave_ray: bool = False) -> None:
        import ray

        if self.supervision is not None:  # first: it would re-create what is killed below
            self.supervision.stop()
            self.supervision = None
        for handle in [*self.prefill.values(), *self.decode.values(), self.scheduler, self.monitor]:
            try:
                kill(handle)
            except Exception:  # already gone
                logger.debug("actor already gone", exc_info=True)
        if self.owns_ray and not leave_ray:
            ray.shutdown()

    # -- what front doors ask of the control plane (the ControlPlane actor answers the same for a detached one) --
    def supervision_state(self) -> SupervisionState:
        sup = self.supervision
        if sup is None:
            return SupervisionState({}, {})
        return SupervisionState({slot.name: slot for slot in sup.view()}, sup.elastic.lifecycles())

    def flip(self, worker_id: str, role: str) -> str:
        return self._elastic().flip(worker_id, parse_role(role), time.monotonic())

    def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return self._elastic().scale(role_counts(prefill, decode), time.monotonic())

    def observe_slo(
        self, ttft_ms: float, tpot_ms: float | None, ttft_slo_ms: float | None, tbt_slo_ms: float | None
    ) -> None:
        """A request that ended normally, for SLO attainment (the ``slo`` flip policy's input)."""
        if self.slo is not None:
            self.slo.observe(time.monotonic(), ttft_ms, tpot_ms, ttft_slo_ms, tbt_slo_ms)

    def control(self) -> LocalControl:
        return LocalControl(self)

    def _elastic(self) -> Elastic:
        if self.supervision is None:
            raise ValueError("flips and scaling need the supervisor (config: supervise: true)")
        return self.supervision.elastic


class LocalControl:
    """A cluster of this process's own, with the calls a front door makes of a control plane (as ``RemoteCluster``
    makes them of the ControlPlane actor)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def supervision_state(self) -> SupervisionState:
        return self.cluster.supervision_state()

    async def flip(self, worker_id: str, role: str) -> str:
        return self.cluster.flip(worker_id, role)

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return self.cluster.scale(prefill, decode)

    def observe_slo(
        self, ttft_ms: float, tpot_ms: float | None, ttft_slo_ms: float | None, tbt_slo_ms: float | None
    ) -> None:
        self.cluster.observe_slo(ttft_ms, tpot_ms, ttft_slo_ms, tbt_slo_ms)


def init_ray(config: ClusterConfig) -> tuple[bool, str]:
    """Start or join Ray; returns (whether we started it, dashboard URL)."""
    import ray

    if ray.is_initialized():
        runtime = ray.get_runtime_context()
        return False, getattr(runtime, "dashboard_url", "") or ""
    if config.ray_address is None:
        # Ray starts its worker processes at nice 15; on a machine shared with the front door and other
        # processes that starves the engines (a local cluster only: a joined one keeps its own setting)
        os.environ.setdefault("RAY_worker_niceness", "0")
    else:
        use_ray_token_if_present()

    def start() -> object:
        return ray.init(
            address=config.ray_address,
            namespace=config.namespace,
            include_dashboard=None,
            dashboard_host=config.security.dashboard_host,  # a local cluster's; localhost unless configured
            logging_level=logging.WARNING,
            log_to_driver=True,
        )

    began = time.time()
    try:
        ctx = start()
    except Exception as exc:
        # Ray gives a local raylet a fixed 30 s to register with the GCS; on a loaded machine (or one where the
        # previous cluster's processes are still exiting) it can miss that once. A second start, after removing
        # what the first left, is what one would do by hand. A joined cluster's errors are the user's to see.
        if config.ray_address is not None or "timed out during startup" not in str(exc):
            raise
        logger.warning("the local Ray node did not start in time (%s); starting it once more", exc)
        ray.shutdown()
        _kill_children_since(began)
        ctx = start()
    url = getattr(ctx, "dashboard_url", "") or ""
    return config.ray_address is None, (f"http://{url}" if url and not url.startswith("http") else url)


def _kill_children_since(began: float) -> None:
    """Kill this process's descendants started at or after ``began`` (a failed local Ray start's GCS, raylet and
    helpers: ``ray.init`` raised before it kept a handle to stop them with)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if child.create_time() >= began - 1.0:
                child.kill()
        except psutil.Error:  # gone already
            continue


def use_ray_token_if_present() -> None:
    """Ray 2.60 starts clusters with token authentication, but only a cluster found by ``auto`` turns it on for
    a joining process; with an explicit address, do the same when a token is at hand (Ray's own places:
    ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``). ``RAY_AUTH_MODE`` set by hand wins."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


class ActorBuilder:
    """Builds each named actor of the cluster: at launch, and again (next incarnation) when the supervisor
    re-creates one that died."""

    def __init__(self, config: ClusterConfig, model_path: str) -> None:
        import ray

        self.config = config
        self.model_path = model_path
        self.opts: dict[str, object] = {"num_cpus": 0, "namespace": config.namespace, "max_concurrency": 1000}
        # on a cluster with GPUs each engine gets its own (Ray sets CUDA_VISIBLE_DEVICES per worker actor)
        resources: Callable[[], Mapping[str, float]] = ray.cluster_resources  # unannotated in Ray
        gpus = {"num_gpus": 1} if resources().get("GPU", 0) > 0 else {}
        self.engine_opts = {**self.opts, **gpus, "runtime_env": {"env_vars": engine_env(config.engine)}}
        self.predictor = build_predictor(config.prefill, model_path)  # each worker gets its own (pickled) copy

    def monitor(self) -> MonitorHandle:
        import ray

        c = self.config
        return typed_monitor(
            ray.remote(ClusterMonitor)
            .options(name="cluster-monitor", **self.opts)
            .remote(
                c.report_interval_ms,
                slice_lambda=c.decode.slice_lambda,
                slice_min_interval_s=c.decode.slice_min_interval_s,
                slice_min_interval_iters=c.decode.slice_min_interval_iters,
                stuck_after_s=c.dead_after_s,
                heartbeat_interval_ms=c.heartbeat_interval_ms,
                report_tolerance=c.report_tolerance,
            )
        )

    def scheduler(self, prefill: Mapping[str, WorkerHandle]) -> SchedulerHandle:
        import ray

        return typed_scheduler(
            ray.remote(GlobalScheduler)
            .options(name="global-scheduler", **self.opts)
            .remote(
                dict(prefill),
                limits=self.config.admission,
                tracing_config=self.config.tracing,
                prefix_block_size=self.config.prefix_block_size,
            )
        )

    def decode(self, worker_id: str, incarnation: int = 0) -> WorkerHandle:
        return self.worker(worker_id, "decode", incarnation)

    def prefill(self, worker_id: str, incarnation: int = 0) -> WorkerHandle:
        return self.worker(worker_id, "prefill", incarnation)

    def colocated(self, worker_id: str, incarnation: int = 0) -> WorkerHandle:
        return self.worker(worker_id, "colocated", incarnation)

    def worker(self, worker_id: str, role: str, incarnation: int = 0) -> WorkerHandle:
        """A worker actor starting in ``role`` (a prefill or decode worker can flip to the other with the engine
        it has; a colocated one runs both phases)."""
        import ray

        return typed_worker(
            ray.remote(Worker)
            .options(name=worker_id, **self.engine_opts)
            .remote(worker_id, self.config, self.model_path, self.predictor, role, incarnation)
        )


def launch(config: ClusterConfig, model_path: str) -> Cluster:
    import ray

    owns, dashboard = init_ray(config)
    build = ActorBuilder(config, model_path)
    monitor = build.monitor()
    if config.mode == "colocated":  # every engine runs both phases; requests are placed on them all
        decode: dict[str, WorkerHandle] = {}
        prefill = {f"colocated-{i}": build.colocated(f"colocated-{i}") for i in range(config.num_colocated)}
    else:
        decode = {f"decode-{i}": build.decode(f"decode-{i}") for i in range(config.num_decode)}
        prefill = {f"prefill-{i}": build.prefill(f"prefill-{i}") for i in range(config.num_prefill)}
    scheduler = build.scheduler(prefill)
    cluster = Cluster(config, model_path, scheduler, monitor, prefill, decode, dashboard, owns)
    f = config.flip
    cluster.slo = SloWindow(f.slo_window_s, f.ttft_slo_ms, f.tpot_slo_ms)
    try:
        placed_role = "colocated" if config.mode == "colocated" else "prefill"
        workers = [("decode", wid, h) for wid, h in decode.items()] + [
            (placed_role, wid, h) for wid, h in prefill.items()
        ]
        addresses = ray.get([h.start.remote(monitor, scheduler) for _, _, h in workers])
        ray.get(
            [
                monitor.register.remote(wid, role, h, addr)
                for (role, wid, h), addr in zip(workers, addresses, strict=True)
            ]
        )
        ray.get(monitor.start.remote(scheduler))
        _wait_for_broadcast(cluster)
        if config.supervise:
            from tetriserve.control_plane.supervision import Supervision

            addr = {wid: a for (_, wid, _), a in zip(workers, addresses, strict=True)}
            cluster.supervision = Supervision(cluster, build, addr)
    except Exception:
        cluster.shutdown()
        raise
    return cluster


def _wait_for_broadcast(cluster: Cluster, timeout_s: float = 60.0) -> None:
    """Return once every worker has reported at least once (the dispatchers then have a view)."""
    import ray

    deadline = time.monotonic() + timeout_s
    expected = len(cluster.prefill) + len(cluster.decode)
    while time.monotonic() < deadline:
        members = ray.get(cluster.monitor.snapshot.remote())
        if sum(1 for m in members if m["state"] == "serving") == expected:
            return
        time.sleep(cluster.config.report_interval_ms / 1000)
    raise TimeoutError(f"workers did not all report within {timeout_s:.0f} s")
