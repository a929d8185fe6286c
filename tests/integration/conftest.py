"""One small real cluster (1 prefill + 1 decode vLLM engine on Ray) shared by every integration test that needs
no cluster of its own; it and its front doors export their traces to an in-memory collector (``traces.py``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None:
    pytest.skip("integration tests need vllm and ray", allow_module_level=True)

from tests.fakes import LoopThread
from tests.integration.traces import Collector, running_collector
from tetriserve.common.config import ClusterConfig

CONFIG_OVERRIDES = {
    "engine.dtype": "float32",  # exact token equality with the colocated engine needs float32
    "engine.max_model_len": 1024,
    "engine.enforce_eager": True,  # no torch.compile: the tests start engines, they do not time them
    "engine.kv_cache_gb": 0.5,
    "prefill.chunk_size": 256,
    # prompts are offloaded to decode workers only where a test gives them room (decode.max_local_prompts)
    "prefill.offload_wait_s": 0.01,
    "decode.max_local_prompts": 0,
    "grpc_port": 0,
    "http_port": 0,
    "namespace": "tetriserve-test",
}


def decode_engine_args(model_path: str, endpoint: str, num_blocks: int) -> Any:
    """EngineArgs of a small in-process decode engine (tiny model, float32, the decode role's scheduler and KV
    connector over tcp) with ``num_blocks`` KV blocks of 32 tokens."""
    from tetriserve.common.config import EngineConfig
    from tetriserve.engine.settings import EngineRole, build_engine_args

    probe = EngineConfig(dtype="float32", max_model_len=512, enforce_eager=True, kv_cache_gb=0.01)
    args = build_engine_args(
        probe,
        model_path,
        EngineRole.DECODE,
        endpoint=endpoint,
        transport="tcp",
        chunk_size=512,
        scheduler_cls="tetriserve.decode_worker.vllm_scheduler.TetriDecodeScheduler",
    )
    args.num_gpu_blocks_override = num_blocks
    return args


def wait_room_seen(prefill: list[Any], room: int, seconds: float = 10, since: float | None = None) -> None:
    """Wait until every prefill worker (actor handles) sees ``room`` for offloaded prompts on every decode worker
    it knows: a decode worker's changed ``decode.max_local_prompts`` reaches them with a load broadcast, within
    the monitor's heartbeat. ``since`` (``time.time()`` before the change): only in loads reported after it; a
    view from before (an earlier test's room, about to be replaced by its reset) does not count."""
    import time

    import ray

    def seen(worker: Any) -> list[int]:
        loads = worker.role.directory.loads.values()
        return [load.prompt_room if since is None or load.at >= since else -1 for load in loads]

    deadline = time.monotonic() + seconds
    while True:
        found = ray.get([h.__ray_call__.remote(seen) for h in prefill])
        if all(rooms and set(rooms) == {room} for rooms in found):
            return
        assert time.monotonic() < deadline, f"prefill workers see room {found}, not {room}"
        time.sleep(0.1)


@dataclass
class Frontend:
    cluster: Any
    backend: Any
    admin: Any
    loop: LoopThread
    grpc_target: str
    http_url: str


@pytest.fixture(scope="session")
def model_path() -> str:
    return _tiny_model()


def _tiny_model() -> str:
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    return str(build_tiny_model(default_tiny_model_dir()))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The parity tests run last (on the shared cluster); their plain vLLM server starts now, at the lowest
    priority, on what the tests before them leave idle (``tests/vllm_reference.py``)."""
    if any(item.nodeid.startswith("tests/integration/test_vllm_parity.py") for item in session.items):
        from tests.integration.test_vllm_parity import REFERENCE_ARGS
        from tests.vllm_reference import prestart

        prestart(_tiny_model(), REFERENCE_ARGS)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.vllm_reference import stop_prestarted

    stop_prestarted()


@contextmanager
def own_cluster(model_path: str, overrides: dict[str, Any]) -> Iterator[Any]:
    """A cluster of a test module's own (``overrides`` on top of ``CONFIG_OVERRIDES``; give it its own namespace).
    With a ``preset`` among ``overrides``, the keys it sets are the preset's, not ``CONFIG_OVERRIDES``'."""
    from tetriserve.common.presets import PRESETS
    from tetriserve.control_plane.launcher import launch

    preset = PRESETS[overrides["preset"]].settings if "preset" in overrides else {}
    base = {key: value for key, value in CONFIG_OVERRIDES.items() if key not in preset}
    handle = launch(ClusterConfig.load(overrides={**base, **overrides}), model_path)
    try:
        yield handle
    finally:
        handle.shutdown()


MODES = ("colocated", "disaggregated")


def in_mode(mode: str, namespace: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``own_cluster``'s overrides for two workers in ``mode``: two colocated ones (``num_prefill + num_decode`` =
    1 + 1), or one prefill and one decode worker; with the baseline predictor, in the namespace
    ``<namespace>-<mode>``, and ``settings``."""
    base = {"namespace": f"{namespace}-{mode}", "mode": mode, "num_prefill": 1, "num_decode": 1}
    return {**base, "prefill.predictor": "baseline", **settings}


@pytest.fixture(scope="session")
def trace_collector() -> Iterator[Collector]:
    with running_collector() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def cluster(model_path: str, trace_collector: Collector) -> Iterator[Any]:
    from tetriserve.control_plane.launcher import launch

    tracing = {"tracing.enabled": True, "tracing.endpoint": trace_collector.endpoint}
    config = ClusterConfig.load(overrides={**CONFIG_OVERRIDES, **tracing})
    handle = launch(config, model_path)
    try:
        yield handle
    finally:
        handle.shutdown()


@pytest.fixture(scope="session")
def frontend(cluster: Any) -> Iterator[Frontend]:
    import asyncio

    from tetriserve.cli.serve import Endpoints, run_front_doors
    from tetriserve.frontdoor.ray_admin import RayAdmin
    from tetriserve.frontdoor.ray_backend import RayBackend
    from tetriserve.observability import tracing

    backend, admin = RayBackend(cluster, "tiny-llama"), RayAdmin(cluster, "tiny-llama")
    loop = LoopThread()
    stop: asyncio.Event = loop.run(_make_event())
    ready: asyncio.Future[Endpoints] = loop.run(_make_future())
    front_doors = run_front_doors(cluster.config, backend, admin, stop, ready)
    task = asyncio.run_coroutine_threadsafe(front_doors, loop.loop)
    endpoints = loop.run(_await(ready), timeout=60)
    try:
        yield Frontend(cluster, backend, admin, loop, endpoints.grpc, endpoints.http)
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        task.result(30)
        loop.stop()
        tracing.shutdown()  # this process's tracer (the front doors'), flushed


async def _make_event() -> Any:
    import asyncio

    return asyncio.Event()


async def _make_future() -> Any:
    import asyncio

    return asyncio.get_running_loop().create_future()


async def _await(fut: Any) -> Any:
    return await fut
