"""The one place that builds the cluster's Ray actors and wires them together.

    ray.init (local, or --address) ─▶ ClusterMonitor  "cluster-monitor"
                                    ─▶ DecodeWorker    "decode-0..N"    (engines start in parallel)
                                    ─▶ PrefillWorker   "prefill-0..M"   (+ its length predictor, factory.py)
                                    ─▶ GlobalScheduler "global-scheduler"
    then: workers register with the monitor, start their 100 ms load reports (and state
    events to the GlobalScheduler), and the monitor starts broadcasting. Front doors
    open their streams to the workers themselves (``ray_backend``).

Worker modules stay Ray-free: the classes are wrapped with ``ray.remote`` here.
Every actor is named (in the config's namespace) so the Ray dashboard shows who
is who, and reserves no CPU (``num_cpus=0``) so a 2-core machine can hold the
whole cluster; engine threads are bounded by ``threads_per_engine`` instead.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tetriserve.common.config import ClusterConfig
from tetriserve.control_plane.cluster_monitor import ClusterMonitor
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.decode_worker.worker import DecodeWorker
from tetriserve.engine.settings import engine_env
from tetriserve.length_predictor.factory import build_predictor
from tetriserve.prefill_worker.worker import PrefillWorker

logger = logging.getLogger(__name__)


@dataclass
class Cluster:
    config: ClusterConfig
    model_path: str
    scheduler: Any
    monitor: Any
    prefill: dict[str, Any]
    decode: dict[str, Any]
    dashboard_url: str = ""
    owns_ray: bool = False
    started_at: float = field(default_factory=time.time)

    def shutdown(self) -> None:
        import ray

        for handle in [*self.prefill.values(), *self.decode.values(), self.scheduler, self.monitor]:
            try:
                ray.kill(handle)
            except Exception:  # already gone
                logger.debug("actor already gone", exc_info=True)
        if self.owns_ray:
            ray.shutdown()


def init_ray(config: ClusterConfig) -> tuple[bool, str]:
    """Start or join Ray; returns (whether we started it, dashboard URL)."""
    import ray

    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return False, getattr(ctx, "dashboard_url", "") or ""
    if config.ray_address is None:
        # Ray starts its worker processes at nice 15; on a machine shared with the front door and other
        # processes that starves the engines (a local cluster only: a joined one keeps its own setting)
        os.environ.setdefault("RAY_worker_niceness", "0")
    ctx = ray.init(
        address=config.ray_address,
        namespace=config.namespace,
        include_dashboard=None,
        logging_level=logging.WARNING,
        log_to_driver=True,
    )
    url = getattr(ctx, "dashboard_url", "") or ""
    return config.ray_address is None, (f"http://{url}" if url and not url.startswith("http") else url)


def launch(config: ClusterConfig, model_path: str) -> Cluster:
    import ray

    owns, dashboard = init_ray(config)
    ns = config.namespace
    runtime_env = {"env_vars": engine_env(config.engine)}
    opts = {"num_cpus": 0, "namespace": ns, "lifetime": None, "max_concurrency": 1000}
    # on a cluster with GPUs each engine gets its own (Ray sets CUDA_VISIBLE_DEVICES per worker actor)
    engine_opts = dict(opts, num_gpus=1) if ray.cluster_resources().get("GPU", 0) > 0 else opts

    monitor = (
        ray.remote(ClusterMonitor)
        .options(name="cluster-monitor", **opts)
        .remote(
            config.report_interval_ms,
            slice_lambda=config.slice_lambda,
            slice_min_interval_s=config.slice_min_interval_s,
        )
    )
    decode = {
        f"decode-{i}": ray.remote(DecodeWorker)
        .options(name=f"decode-{i}", runtime_env=runtime_env, **engine_opts)
        .remote(f"decode-{i}", config, model_path)
        for i in range(config.num_decode)
    }
    predictor = build_predictor(config.prefill, model_path)  # each worker gets its own (pickled) copy
    prefill = {
        f"prefill-{i}": ray.remote(PrefillWorker)
        .options(name=f"prefill-{i}", runtime_env=runtime_env, **engine_opts)
        .remote(f"prefill-{i}", config, model_path, predictor)
        for i in range(config.num_prefill)
    }
    scheduler = ray.remote(GlobalScheduler).options(name="global-scheduler", **opts).remote(prefill)
    cluster = Cluster(config, model_path, scheduler, monitor, prefill, decode, dashboard, owns)
    try:
        workers = [("decode", wid, h) for wid, h in decode.items()] + [
            ("prefill", wid, h) for wid, h in prefill.items()
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
