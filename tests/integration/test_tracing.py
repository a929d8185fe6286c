"""One request's trace across the real cluster: spans from the front door, the
GlobalScheduler, the prefill worker (queue, compute, length prediction, KV send) and the decode worker
(admission, KV load, decode run), all in one trace.

The shared integration cluster and its front doors export every span over OTLP/gRPC to a collector the tests run
in memory (``trace_collector``, ``traces.py``): the Ray actors' spans reach the test the way they reach Jaeger,
with no test-only hook in the actors. This test's request is told apart from the other tests' by the trace its
client starts.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes import wait_until
from tests.integration.traces import Collector

pytestmark = pytest.mark.integration

CLIENT_TRACE = "5" * 32
CLIENT_SPAN = "6" * 16

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


def test_one_request_has_spans_from_every_component_it_crossed(frontend: Any, trace_collector: Collector) -> None:
    receiver, url = trace_collector, frontend.http_url
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


def test_actors_log_lines_name_the_request(cluster: Any) -> None:
    import ray

    def log_line(worker: Any, traceparent: str) -> str:  # runs in the actor: a warning of request r-7, formatted
        import logging

        from tetriserve.common import log_context

        (handler,) = logging.getLogger().handlers
        name = "tetriserve.prefill_worker.worker"
        with log_context.bound("r-7", traceparent):
            record = logging.getLogger(name).makeRecord(name, logging.WARNING, "f.py", 1, "KV send failed", (), None)
        return str(handler.format(record))

    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    for handle in [cluster.scheduler, *cluster.prefill.values(), *cluster.decode.values()]:
        line = ray.get(handle.__ray_call__.remote(log_line, traceparent), timeout=30)
        assert line.endswith(f"WARNING tetriserve.prefill_worker.worker [req=r-7 trace={CLIENT_TRACE}]: KV send failed")
