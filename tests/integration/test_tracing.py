"""One request's trace across the real cluster (issue #17, part 6): spans from the front door, the
GlobalScheduler, the prefill worker (queue, compute, length prediction, KV send) and the decode worker
(admission, KV load, decode run), all in one trace.

Every process exports over OTLP/gRPC to a collector this test runs in memory (``Collector``): the Ray actors'
spans reach the test the way they reach Jaeger, with no test-only hook in the actors. The cluster is this
module's own (tracing is set up when an actor starts).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.fakes import LoopThread, wait_until
from tests.integration.conftest import own_cluster
from tetriserve.common import tracing

pytestmark = pytest.mark.integration

CLIENT_TRACE = "5" * 32
CLIENT_SPAN = "6" * 16


@dataclass(frozen=True)
class Exported:
    name: str
    process: str  # the resource's tetriserve.process
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver keeping every span in memory."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        attributes = {a.key: _value(a.value) for a in s.attributes}
                        self.spans.append(
                            Exported(
                                s.name,
                                resource.get("tetriserve.process", ""),
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                attributes,
                            )
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Exported]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    receiver = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, port
    server.stop(None)


@pytest.fixture(scope="module")
def traced(model_path: str, collector: tuple[Collector, int]) -> Iterator[tuple[Collector, str, Any]]:
    """A cluster and front doors exporting to ``collector``; yields it, the HTTP front door's URL and the cluster."""
    from tetriserve.control_plane.ray_backend import RayBackend
    from tetriserve.control_plane.serve import run_front_doors

    receiver, port = collector
    overrides = {
        "namespace": "tetriserve-test-tracing",
        "tracing.enabled": True,
        "tracing.endpoint": f"127.0.0.1:{port}",
    }
    with own_cluster(model_path, overrides) as cluster:
        loop = LoopThread()
        stop: asyncio.Event = loop.run(_event())
        ready: asyncio.Future[Any] = loop.run(_future())
        backend = RayBackend(cluster, "tiny-llama")
        task = asyncio.run_coroutine_threadsafe(run_front_doors(cluster.config, backend, stop, ready), loop.loop)
        endpoints = loop.run(_await(ready), timeout=60)
        try:
            yield receiver, endpoints.http, cluster
        finally:
            loop.loop.call_soon_threadsafe(stop.set)
            task.result(30)
            loop.stop()
            tracing.shutdown()  # this process's tracer (the front doors'), flushed


EXPECTED = {  # span -> the process that records it
    "tetriserve.request": "frontdoor",
    "tetriserve.place": "global-scheduler",
    "tetriserve.prefill": "prefill-0",
    "tetriserve.prefill.queue": "prefill-0",
    "tetriserve.prefill.compute": "prefill-0",
    "tetriserve.length_prediction": "prefill-0",
    "tetriserve.kv.send": "prefill-0",
    "tetriserve.decode": "decode-0",
    "tetriserve.decode.admission": "decode-0",
    "tetriserve.decode.engine_queue": "decode-0",
    "tetriserve.decode.first_step": "decode-0",
    "tetriserve.kv.load": "decode-0",
    "tetriserve.decode.run": "decode-0",
}


def test_one_request_has_spans_from_every_component_it_crossed(traced: tuple[Collector, str, Any]) -> None:
    receiver, url, _ = traced
    body = {"model": "tiny-llama", "prompt": "Trace this request", "max_tokens": 8, "ignore_eos": True}
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    rid = response.headers["x-request-id"]

    def complete() -> bool:
        return EXPECTED.keys() <= {s.name for s in receiver.trace(CLIENT_TRACE)}

    # the actors export in batches (the SDK's default: every 5 s)
    wait_until(complete, timeout=60, what="every component's spans at the collector")
    spans = receiver.trace(CLIENT_TRACE)
    by_name = {s.name: s for s in spans}
    for name, process in EXPECTED.items():
        assert by_name[name].process == process, name

    root = by_name["tetriserve.request"]
    assert root.parent_id == CLIENT_SPAN  # the client's traceparent was followed
    assert root.attributes["tetriserve.route"] == "POST /v1/completions"
    assert root.attributes["tetriserve.request_id"] == rid
    assert root.attributes["gen_ai.usage.output_tokens"] == 8
    assert root.attributes["gen_ai.response.finish_reasons"] == ["length"]
    # every span hangs in one tree under the root
    ids = {s.span_id for s in spans}
    assert all(s.parent_id in ids for s in spans if s is not root)
    for name in ("tetriserve.place", "tetriserve.prefill", "tetriserve.decode"):
        assert by_name[name].parent_id == root.span_id, name
    prefill, decode = by_name["tetriserve.prefill"], by_name["tetriserve.decode"]
    for name in ("tetriserve.prefill.queue", "tetriserve.prefill.compute", "tetriserve.kv.send"):
        assert by_name[name].parent_id == prefill.span_id, name
    for name in ("tetriserve.decode.admission", "tetriserve.kv.load", "tetriserve.decode.run"):
        assert by_name[name].parent_id == decode.span_id, name
    for name in ("tetriserve.decode.engine_queue", "tetriserve.decode.first_step"):
        assert by_name[name].parent_id == decode.span_id, name
    assert by_name["tetriserve.place"].attributes["tetriserve.prefill_worker"] == "prefill-0"
    assert prefill.attributes["tetriserve.decode_worker"] == "decode-0"
    send, load = by_name["tetriserve.kv.send"], by_name["tetriserve.kv.load"]
    assert send.attributes["tetriserve.kv.bytes"] > 0 and load.attributes["tetriserve.kv.bytes"] > 0
    assert send.attributes["tetriserve.kv.backend"] == load.attributes["tetriserve.kv.backend"] != ""
    assert decode.attributes["tetriserve.finish_reason"] == "length"


def test_actors_log_lines_name_the_request(traced: tuple[Collector, str, Any]) -> None:
    import ray

    def log_line(worker: Any, traceparent: str) -> str:  # runs in the actor: a warning of request r-7, formatted
        import logging

        from tetriserve.common import log_context

        (handler,) = logging.getLogger().handlers
        name = "tetriserve.prefill_worker.worker"
        with log_context.bound("r-7", traceparent):
            record = logging.getLogger(name).makeRecord(name, logging.WARNING, "f.py", 1, "KV send failed", (), None)
        return str(handler.format(record))

    _, _, cluster = traced
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    for handle in [cluster.scheduler, *cluster.prefill.values(), *cluster.decode.values()]:
        line = ray.get(handle.__ray_call__.remote(log_line, traceparent), timeout=30)
        assert line.endswith(f"WARNING tetriserve.prefill_worker.worker [req=r-7 trace={CLIENT_TRACE}]: KV send failed")


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def _await(fut: Any) -> Any:
    return await fut
