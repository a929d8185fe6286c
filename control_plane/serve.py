"""`tetriserve serve`: build/resolve the model, launch the cluster, run both front doors until a signal.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tetriserve.common.config import ClusterConfig

if TYPE_CHECKING:
    from tetriserve.control_plane.frontdoor import FrontDoor

logger = logging.getLogger(__name__)

DRAIN_REPORT_S = 5.0  # how often a drain says how many requests it waits for


@dataclass(frozen=True)
class Endpoints:
    grpc: str
    http: str
    dashboard: str


def resolve_model(config: ClusterConfig) -> tuple[str, str]:
    """(model directory, served name); builds the tiny model on first use when no model is given."""
    if config.engine.model is None:
        from tetriserve.control_plane.model_builder import build_tiny_model, default_tiny_model_dir

        path = build_tiny_model(default_tiny_model_dir())
    else:
        path = Path(config.engine.model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"engine.model: {path} is not a Hugging Face model directory (no config.json)")
    return str(path), config.engine.served_model_name or path.name


def check_prefill_policy(config: ClusterConfig, model_path: str) -> None:
    """Fail before launching anything when the prefill policy cannot be built (e.g. no cost profile)."""
    from tetriserve.engine.hardware import detect_hardware
    from tetriserve.prefill_worker.policy import build_prefill_policy, load_cost, spec_from_config

    build_prefill_policy(spec_from_config(config.prefill), load_cost(config.prefill, model_path, detect_hardware()))


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
    backend: object,
    stop: asyncio.Event,
    ready: asyncio.Future[Endpoints] | None = None,
    dashboard: str = "",
    hurry: asyncio.Event | None = None,
) -> None:
    """Serve both front doors until ``stop``; then drain (``config.drain_grace_s``, cut short by ``hurry``)."""
    from tetriserve.control_plane.frontdoor import FrontDoor
    from tetriserve.control_plane.gateway_grpc import start_grpc_server
    from tetriserve.control_plane.gateway_http import start_http_server
    from tetriserve.control_plane.http_limits import megabytes
    from tetriserve.control_plane.metrics import MetricsExporter

    front = await asyncio.to_thread(FrontDoor, backend, None, config.admission)  # type: ignore[arg-type]
    metrics = MetricsExporter(front, backend)  # GET /metrics, and the Ray dashboard's metrics when on Ray
    body_limit = megabytes(config.max_request_body_mb)
    grpc_server, grpc_port = await start_grpc_server(  # type: ignore[arg-type]
        backend, config.host, config.grpc_port, front=front, max_message_bytes=body_limit
    )
    http = await start_http_server(  # type: ignore[arg-type]
        backend,
        config.host,
        config.http_port,
        front=front,
        keepalive_s=config.http_keepalive_s,
        max_body_bytes=body_limit,
        metrics=metrics,
    )
    ray_metrics = asyncio.create_task(metrics.run_ray()) if _on_ray() else None
    endpoints = Endpoints(f"{config.host}:{grpc_port}", f"http://{config.host}:{http.port}", dashboard)
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


def _on_ray() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def serve(config: ClusterConfig) -> None:
    from tetriserve.control_plane.launcher import launch
    from tetriserve.control_plane.ray_backend import RayBackend

    t0 = time.monotonic()
    model_path, name = resolve_model(config)
    print(f"tetriserve: model {name} ({model_path})", flush=True)
    check_prefill_policy(config, model_path)
    check_decode_policy(config)
    print(f"tetriserve: starting {config.num_prefill} prefill + {config.num_decode} decode workers ...", flush=True)
    cluster = launch(config, model_path)
    backend = RayBackend(cluster, name)

    async def main() -> None:
        stop, hurry = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:  # the first one drains, a second one cuts the drain short
            (hurry if stop.is_set() else stop).set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        ready: asyncio.Future[Endpoints] = loop.create_future()
        task = asyncio.create_task(run_front_doors(config, backend, stop, ready, cluster.dashboard_url, hurry))
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            task.result()  # the front doors failed to start: raise why
        ep = ready.result()
        print(f"tetriserve: ready in {time.monotonic() - t0:.1f} s", flush=True)
        print(f"  gRPC            {ep.grpc}", flush=True)
        print(f"  OpenAI HTTP     {ep.http}/v1  (model '{name}')", flush=True)
        print(f"  Ray dashboard   {ep.dashboard or 'not running'}", flush=True)
        grace = config.drain_grace_s
        print(f"  Ctrl-C stops the service (SIGTERM too), draining up to {grace:g} s; twice: at once.", flush=True)
        await task

    try:
        asyncio.run(main())
    finally:
        print("tetriserve: shutting down", flush=True)
        cluster.shutdown()
