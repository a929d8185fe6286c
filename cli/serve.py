"""`tetriserve serve`: build/resolve the model, start the control plane, run both front doors until a signal;
`tetriserve frontdoor`: one more pair of front doors for a running service.

``serve`` starts Ray (or joins ``--address``) and the detached ControlPlane
actor, which launches and supervises the workers (``control_plane/control_plane.py``); its own
front doors reach the cluster through the control plane like any other
(``frontdoor/remote_cluster.py``). ``frontdoor`` joins the Ray cluster of a running
service and does the same; it leaves the cluster as it is when it stops.

The first SIGTERM / SIGINT drains: the front doors admit nothing new (``/ready``
answers 503, new requests 503 / UNAVAILABLE) and admitted requests run to their
end for up to ``drain_grace_s``; then the servers and the cluster stop. A second
signal cuts the drain short.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tetriserve.common.config import ClusterConfig
from tetriserve.common.gc_heap import freeze_heap

if TYPE_CHECKING:
    from tetriserve.engine.core_layout import CoreLayout
    from tetriserve.frontdoor.backend import AdminClient, RequestRouter
    from tetriserve.frontdoor.core import FrontDoor
    from tetriserve.frontdoor.remote_cluster import RemoteCluster

logger = logging.getLogger(__name__)

DRAIN_REPORT_S = 5.0  # how often a drain says how many requests it waits for
START_TIMEOUT_S = 900.0  # the cluster's start: engines load and profile in parallel


@dataclass(frozen=True)
class Endpoints:
    grpc: str
    http: str
    dashboard: str
    security: str = ""  # e.g. "API key required (2 keys); TLS on"
    tls: bool = False


def resolve_model(config: ClusterConfig) -> tuple[str, str]:
    """(model directory, served name); builds the tiny model on first use when no model is given."""
    if config.engine.model is None:
        from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

        path = build_tiny_model(default_tiny_model_dir())
    else:
        path = Path(config.engine.model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"engine.model: {path} is not a Hugging Face model directory (no config.json)")
    return str(path), config.engine.served_model_name or path.name


def check_prefill_policy(config: ClusterConfig, model_path: str) -> None:
    """Fail before launching anything when the prefill policy cannot be built (e.g. no cost profile)."""
    from tetriserve.engine.hardware import detect_hardware
    from tetriserve.prefill_worker.policy import AccelGenParams, build_prefill_policy, load_cost, spec_from_config

    build_prefill_policy(
        spec_from_config(config.prefill),
        load_cost(config.prefill, model_path, detect_hardware()),
        AccelGenParams.from_config(config.prefill),
    )


def check_decode_policy(config: ClusterConfig) -> None:
    """Fail before launching anything when the decode policies cannot be built (e.g. auto without a profile)."""
    from tetriserve.decode_worker.policy import decode_policies

    decode_policies(config.decode)


async def drain(front: FrontDoor, grace_s: float, hurry: asyncio.Event | None = None) -> None:
    """Admit nothing more and wait, up to ``grace_s`` (or until ``hurry``), for admitted requests to finish,
    saying every few seconds how many are left."""
    front.gate.close()
    deadline = time.monotonic() + grace_s
    said = -math.inf
    while front.gate.inflight and time.monotonic() < deadline and not (hurry is not None and hurry.is_set()):
        if time.monotonic() - said >= DRAIN_REPORT_S:
            said = time.monotonic()
            left = deadline - said
            print(f"tetriserve: draining, {front.gate.inflight} requests in flight, {left:.0f} s left", flush=True)
        await asyncio.sleep(0.05)
    if front.gate.inflight:
        print(f"tetriserve: drain over, {front.gate.inflight} requests cut short", flush=True)


async def run_front_doors(
    config: ClusterConfig,
    backend: RequestRouter,
    admin: AdminClient,
    stop: asyncio.Event,
    ready: asyncio.Future[Endpoints] | None = None,
    dashboard: str = "",
    hurry: asyncio.Event | None = None,
) -> None:
    """Serve both front doors over ``backend`` (requests) and ``admin`` (administration, health, metrics) until
    ``stop``; then drain (``config.drain_grace_s``, cut short by ``hurry``)."""
    from tetriserve.frontdoor.core import FrontDoor
    from tetriserve.frontdoor.gateway_grpc import start_grpc_server
    from tetriserve.frontdoor.gateway_http import start_http_server
    from tetriserve.frontdoor.http_limits import megabytes
    from tetriserve.frontdoor.security import FrontDoorSecurity
    from tetriserve.observability import tracing
    from tetriserve.observability.metrics import MetricsExporter
    from tetriserve.observability.request_trace import RequestTrace

    tracing.setup(config.tracing, "frontdoor")  # this process's spans (each front door is a process of its own)
    security = FrontDoorSecurity.from_config(config.security)
    security.warn_if_exposed(config.host)
    trace = RequestTrace(config.request_trace) if config.request_trace else None
    front = await asyncio.to_thread(FrontDoor, backend, None, config.admission, admin, config.slo, trace)
    metrics = MetricsExporter(front, admin)  # GET /metrics, and the Ray dashboard's metrics when on Ray
    body_limit = megabytes(config.max_request_body_mb)
    grpc_server, grpc_port = await start_grpc_server(
        backend, config.host, config.grpc_port, front=front, max_message_bytes=body_limit, security=security
    )
    http = await start_http_server(
        backend,
        config.host,
        config.http_port,
        front=front,
        keepalive_s=config.http_keepalive_s,
        max_body_bytes=body_limit,
        security=security,
        metrics=metrics,
    )
    ray_metrics = asyncio.create_task(metrics.run_ray()) if _on_ray() else None
    tls = security.tls is not None
    endpoints = Endpoints(f"{config.host}:{grpc_port}", http.url, dashboard, security.describe(), tls)
    if ready is not None:
        ready.set_result(endpoints)
    try:
        await stop.wait()
        await drain(front, config.drain_grace_s, hurry)
    finally:
        if ray_metrics is not None:
            ray_metrics.cancel()
        await http.stop()
        await grpc_server.stop(2.0)
        close = getattr(backend, "close", None)
        if close is not None:
            close()
        if trace is not None:
            trace.close()


def _on_ray() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def serve(config: ClusterConfig) -> None:
    """Start Ray (or join ``config.ray_address``), the detached control plane with its workers, and one pair of
    front doors; on a signal, drain and stop the whole service."""
    from tetriserve.control_plane.control_plane import start_control_plane, stop_control_plane
    from tetriserve.control_plane.launcher import init_ray
    from tetriserve.frontdoor.ray_admin import RayAdmin
    from tetriserve.frontdoor.ray_backend import RayBackend
    from tetriserve.frontdoor.remote_cluster import RemoteCluster

    t0 = time.monotonic()
    model_path, name = resolve_model(config)
    print(f"tetriserve: model {name} ({model_path})", flush=True)
    check_prefill_policy(config, model_path)
    check_decode_policy(config)
    layout = reserve_cores(config)
    owns_ray, dashboard = init_ray(config)
    if config.mode == "colocated":
        print(f"tetriserve: starting {config.num_colocated} colocated workers ...", flush=True)
    else:
        print(f"tetriserve: starting {config.num_prefill} prefill + {config.num_decode} decode workers ...", flush=True)
    handle = start_control_plane(config, model_path, name, dashboard)
    cluster = None
    try:
        cluster = RemoteCluster.join(handle, START_TIMEOUT_S)
        if layout is not None:
            settle_service(config, layout)
        print(f"tetriserve: {join_hint(config.namespace)}", flush=True)
        what = "the service" if owns_ray else "the service (only this front door while others are attached)"
        run_until_signal(config, RayBackend(cluster, name), RayAdmin(cluster, name), t0, dashboard, what, cluster.gone)
    finally:
        # on a Ray instance of its own the service ends with this process (Ray's processes share its fate)
        others = cluster.others() if cluster is not None and not owns_ray else []
        if cluster is not None:
            cluster.close()
        if others:  # the service goes on behind them
            print(
                f"tetriserve: this front door stops; {len(others)} more attached, so the service keeps running "
                f"(`tetriserve stop --address ... --namespace {config.namespace}` stops it)",
                flush=True,
            )
        else:
            print("tetriserve: shutting down", flush=True)
            stop_control_plane(handle)
            if owns_ray:
                import ray

                ray.shutdown()


def settle_service(config: ClusterConfig, layout: CoreLayout) -> None:
    """The service is up: every thread but the engines' to the rest's cores (front doors too), unless the decode
    engines share theirs (``engine.cpu.share_decode_cores``), which needs them to go first there (CAP_SYS_NICE)."""
    from tetriserve.engine.core_layout import settle_on_rest
    from tetriserve.engine.cores import may_raise_priority

    shared = config.engine.placement().share_decode_cores
    if shared != "none":
        if may_raise_priority():
            print(f"tetriserve: the decode engines' cores are shared ({shared})", flush=True)
            return
        logger.warning(
            "engine.cpu.share_decode_cores needs CAP_SYS_NICE: the decode engines keep their cores to themselves"
        )
    settle_on_rest(layout)


def reserve_cores(config: ClusterConfig) -> CoreLayout | None:
    """Before a Ray cluster of the service's own starts on a CPU machine: the decode engines' cores
    (``engine.cpu.reserve_decode_cores``, ``engine/core_layout.py``), or None."""
    if config.ray_address is not None or not config.engine.placement().reserve_decode_cores or _on_ray():
        return None
    from tetriserve.engine.core_layout import cpu_list, reserve_decode_cores

    layout = reserve_decode_cores(config.num_decode, config.engine.threads_per_engine)
    if layout is not None:
        decode, rest = cpu_list(layout.decode), cpu_list(layout.rest)
        print(f"tetriserve: decode engines on cores {decode}, the rest of the service on {rest}", flush=True)
    return layout


def stop_service(address: str, namespace: str) -> None:
    """`tetriserve stop`: end a running service (its control plane stops every worker), wherever its front doors
    are."""
    from tetriserve.control_plane.launcher import use_ray_token_if_present

    use_ray_token_if_present()
    import ray

    from tetriserve.control_plane.control_plane import find_control_plane, stop_control_plane

    ray.init(address=address, namespace=namespace, logging_level=logging.WARNING)
    try:
        stop_control_plane(find_control_plane(namespace))
        print(f"tetriserve: the service in namespace {namespace!r} is stopped", flush=True)
    finally:
        ray.shutdown()


def join_hint(namespace: str) -> str:
    import ray

    gcs = ray.get_runtime_context().gcs_address
    return f"Ray cluster {gcs}; more front doors: tetriserve frontdoor --address {gcs} --namespace {namespace}"


def frontdoor(
    config: ClusterConfig, namespace: str, model: str | None = None, security_changes: dict[str, object] | None = None
) -> None:
    """Join a running service's Ray cluster (``config.ray_address``) as one more pair of front doors, bound to
    ``config.host`` / ports; on a signal, drain this front door's requests and leave (the cluster stays). It
    enforces the service's keys, quotas and TLS, with ``security_changes`` (``{"rate_per_s": 5.0}``) over them:
    a setting not given stays the service's, so a quota given here does not open the doors."""
    from tetriserve.control_plane.launcher import use_ray_token_if_present

    use_ray_token_if_present()
    import ray

    from tetriserve.control_plane.control_plane import find_control_plane
    from tetriserve.frontdoor.ray_admin import RayAdmin
    from tetriserve.frontdoor.ray_backend import RayBackend
    from tetriserve.frontdoor.remote_cluster import RemoteCluster

    t0 = time.monotonic()
    ray.init(address=config.ray_address or "auto", namespace=namespace, logging_level=logging.WARNING)
    cluster = RemoteCluster.join(find_control_plane(namespace), START_TIMEOUT_S)
    try:
        served = cluster.config
        # the cluster's settings (admission, timeouts, ...), with this front door's own address
        own = {"host": config.host, "grpc_port": config.grpc_port, "http_port": config.http_port}
        if security_changes:
            own["security"] = served.security.updated(security_changes)
        config = served.model_copy(update=own)
        cluster.model_path = _local_model(cluster, model)
        print(f"tetriserve: front door joining the service in namespace {namespace!r}", flush=True)
        backend, admin = RayBackend(cluster, cluster.served_name), RayAdmin(cluster, cluster.served_name)
        run_until_signal(config, backend, admin, t0, cluster.dashboard_url, "this front door", cluster.gone)
    finally:
        print("tetriserve: front door leaving (the service keeps running)", flush=True)
        cluster.close()
        ray.shutdown()


def _local_model(cluster: RemoteCluster, model: str | None) -> str:
    """Where this process reads the tokenizer: ``--model``, the cluster's model path if this host has it, or the
    tiny model built here (the default model is built the same everywhere)."""
    path = Path(model or cluster.model_path).expanduser()
    if (path / "config.json").is_file():
        return str(path)
    config = cluster.config
    if model is None and config.engine.model is None:
        return resolve_model(config)[0]
    raise ValueError(f"--model: {path} is not a model directory on this host (the front door needs its tokenizer)")


def run_until_signal(
    config: ClusterConfig,
    backend: RequestRouter,
    admin: AdminClient,
    t0: float,
    dashboard: str,
    what: str,
    gone: threading.Event,
) -> None:
    """Serve both front doors until SIGINT / SIGTERM (the first drains, a second cuts the drain short), or until
    the control plane is ``gone`` (the service was stopped)."""

    async def main() -> None:
        stop, hurry = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        async def watch_service() -> None:
            while not gone.is_set():
                await asyncio.sleep(0.5)
            print("tetriserve: the service was stopped (its control plane is gone)", flush=True)
            stop.set()
            hurry.set()

        watcher = asyncio.create_task(watch_service())

        def on_signal() -> None:  # the first one drains, a second one cuts the drain short
            (hurry if stop.is_set() else stop).set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        ready: asyncio.Future[Endpoints] = loop.create_future()
        task = asyncio.create_task(run_front_doors(config, backend, admin, stop, ready, dashboard, hurry))
        started: set[asyncio.Future[Endpoints] | asyncio.Task[None]] = {ready, task}
        await asyncio.wait(started, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            task.result()  # the front doors failed to start: raise why
        ep = ready.result()
        freeze_heap("front doors")  # no full collection of the start-up heap stalls a burst (common/gc_heap.py)
        name = backend.model_name
        print(f"tetriserve: ready in {time.monotonic() - t0:.1f} s", flush=True)
        print(f"  gRPC            {ep.grpc}{'  (TLS)' if ep.tls else ''}", flush=True)
        print(f"  OpenAI HTTP     {ep.http}/v1  (model '{name}')", flush=True)
        print(f"  Ray dashboard   {ep.dashboard or 'not running'}", flush=True)
        print(f"  Security        {ep.security}", flush=True)
        grace = config.drain_grace_s
        print(f"  Ctrl-C stops {what} (SIGTERM too), draining up to {grace:g} s; twice: at once.", flush=True)
        await task
        watcher.cancel()

    asyncio.run(main())
