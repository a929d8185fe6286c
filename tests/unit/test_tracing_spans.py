"""Each component's spans without Ray or vLLM (in-memory exporter): the front door's root span over a fake
backend, the GlobalScheduler's placement, the prefill and decode workers' span helpers; and the request's
traceparent going from the front door into the typed messages."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.actor_fakes import FakeHandle
from tests.fakes import FakeBackend, tokenizer_dir
from tetriserve.common import log_context
from tetriserve.common.length import LengthEstimate
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.stream import PlacementRequest
from tetriserve.common.tracing_config import TracingConfig
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.decode_worker.spans import NO_SPANS, DecodeSpans
from tetriserve.frontdoor.admission import Overloaded
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.frontdoor.ray_backend import RayBackend
from tetriserve.observability import tracing
from tetriserve.prefill_worker import spans as prefill_spans

CLIENT = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"


@pytest.fixture()
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup(TracingConfig(enabled=True), "test", exporter)
    yield exporter
    tracing.shutdown()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


@pytest.fixture(scope="module")
def front() -> FrontDoor:
    return FrontDoor(FakeBackend(tokenizer_dir()))


def _run(front: FrontDoor, request: Request, route: str = "POST /v1/completions") -> list[Any]:
    async def main() -> list[Any]:
        return [d async for d in front.admitted_stream(request, route=route)]

    return asyncio.run(main())


def test_the_front_door_records_a_root_span_and_hands_its_traceparent_on(
    front: FrontDoor, exported: InMemorySpanExporter
) -> None:
    backend: FakeBackend = front.backend  # type: ignore[assignment]
    backend.reset()
    request = Request("r-root", (5, 6, 7), SamplingSpec(max_tokens=3))
    deltas = _run(front, request)
    assert deltas[-1].finish_reason == "length"
    root = _by_name(exported)["tetriserve.request"]
    assert root.kind is SpanKind.SERVER and root.parent is None
    attrs = root.attributes
    assert attrs["tetriserve.route"] == "POST /v1/completions" and attrs["tetriserve.request_id"] == "r-root"
    assert attrs["gen_ai.request.model"] == "tiny-test" and attrs["gen_ai.request.max_tokens"] == 3
    assert attrs["gen_ai.usage.input_tokens"] == 3 and attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["gen_ai.response.finish_reasons"] == ("length",) and attrs["tetriserve.ttft_ms"] >= 0
    assert root.status.status_code is StatusCode.UNSET
    sent = backend.requests[-1].trace  # what the workers continue
    assert (
        sent is not None
        and sent[3:35] == f"{root.context.trace_id:032x}"
        and sent[36:52] == f"{root.context.span_id:016x}"
    )


def test_a_client_traceparent_is_the_root_span_parent(front: FrontDoor, exported: InMemorySpanExporter) -> None:
    front.backend.reset()  # type: ignore[attr-defined]
    _run(front, Request("r-client", (5, 6), SamplingSpec(max_tokens=2), trace=CLIENT), "grpc Generate")
    root = _by_name(exported)["tetriserve.request"]
    assert root.context.trace_id == int("c" * 32, 16) and root.parent is not None
    assert root.parent.span_id == int("d" * 16, 16)


def test_errors_and_refusals_mark_the_root_span(front: FrontDoor, exported: InMemorySpanExporter) -> None:
    backend: FakeBackend = front.backend  # type: ignore[assignment]
    backend.reset()
    backend.behavior.error_after_tokens = 1
    _run(front, Request("r-err", (5, 6), SamplingSpec(max_tokens=4)))
    root = _by_name(exported)["tetriserve.request"]
    assert root.status.status_code is StatusCode.ERROR and "KV transfer failed" in (root.status.description or "")
    assert root.attributes["gen_ai.response.finish_reasons"] == ("error",)
    exported.clear()
    backend.reset()
    backend.behavior.full_retry_after_s = 3
    with pytest.raises(Overloaded):
        _run(front, Request("r-full", (5, 6), SamplingSpec(max_tokens=4)))
    root = _by_name(exported)["tetriserve.request"]
    assert root.status.status_code is StatusCode.ERROR and "Overloaded" in (root.status.description or "")
    assert root.events and root.events[0].name == "exception"


def test_tracing_off_leaves_the_request_untraced(front: FrontDoor) -> None:
    backend: FakeBackend = front.backend  # type: ignore[assignment]
    backend.reset()
    _run(front, Request("r-off", (5, 6), SamplingSpec(max_tokens=2)))
    assert backend.requests[-1].trace is None
    _run(front, Request("r-bad", (5, 6), SamplingSpec(max_tokens=2), trace="x" * 4096))
    assert backend.requests[-1].trace is None  # a malformed client traceparent goes no further
    _run(front, Request("r-client-off", (5, 6), SamplingSpec(max_tokens=2), trace=CLIENT))
    assert backend.requests[-1].trace == CLIENT  # a client's own is passed on (the workers may trace)


def test_placement_carries_the_trace_to_a_place_span(exported: InMemorySpanExporter) -> None:
    gs = GlobalScheduler({"prefill-0": object()})
    gs.prefill_loads = {"prefill-0": PrefillLoad("prefill-0", 0, 0, 0, 0.0)}

    class Cluster:
        scheduler = FakeHandle(gs)
        prefill = {"prefill-0": object()}
        decode: dict[str, Any] = {}
        config = None

    backend = RayBackend(Cluster(), "m")
    root = tracing.start("tetriserve.request")
    request = Request("r-place", (1, 2, 3), trace=tracing.traceparent(root))
    placement = asyncio.run(backend._place(request, ()))
    assert placement.prefill_worker == "prefill-0"
    (_, ((meta,),)) = Cluster.scheduler.calls[-1]  # ``place_many`` with this one request
    assert isinstance(meta, PlacementRequest) and meta.trace == request.trace
    again = asyncio.run(gs.place(meta))  # the same attempt again: rejected, an error span
    assert again.prefill_worker is None
    tracing.end(root)
    places = [s for s in exported.get_finished_spans() if s.name == "tetriserve.place"]
    assert [s.attributes["tetriserve.outcome"] for s in places] == ["placed", "rejected"]
    assert places[0].attributes["tetriserve.prefill_worker"] == "prefill-0"
    assert all(s.parent is not None and s.parent.span_id == root.get_span_context().span_id for s in places)
    assert places[1].status.status_code is StatusCode.ERROR


def test_prefill_spans_hang_under_the_request_span_of_its_task(exported: InMemorySpanExporter) -> None:
    root = tracing.start("tetriserve.request")
    req = Request("r-pre", (1, 2, 3, 4), trace=tracing.traceparent(root))
    sends: dict[str, tracing.Span] = {}

    async def serve() -> None:
        span = prefill_spans.open_prefill("prefill-0", req)
        assert log_context.current() == ("r-pre", f"{root.get_span_context().trace_id:032x}")
        queued = tracing.now_ns()
        computing = prefill_spans.queued(queued, 7)
        prefill_spans.computed(computing, (42,), None)
        prefill_spans.predicted(queued, LengthEstimate(8, 16, 32, 1, 0.9, "baseline"), late=True)
        prefill_spans.sending(sends, "r-pre", tracing.now_ns(), 4096, "shm://host/x", "decode-0")
        tracing.annotate({"tetriserve.decode_worker": "decode-0"})
        tracing.end(span)

    asyncio.run(serve())
    tracing.end(sends.pop("r-pre"), error=None)
    done = _by_name(exported)
    prefill = done["tetriserve.prefill"]
    assert prefill.parent is not None and prefill.parent.span_id == root.get_span_context().span_id
    assert (
        prefill.attributes["tetriserve.worker"] == "prefill-0" and prefill.attributes["tetriserve.prompt_tokens"] == 4
    )
    assert prefill.attributes["tetriserve.decode_worker"] == "decode-0"
    for name in ("tetriserve.prefill.queue", "tetriserve.prefill.compute", "tetriserve.length_prediction"):
        assert done[name].parent.span_id == prefill.context.span_id, name
    assert done["tetriserve.prefill.queue"].attributes["tetriserve.batch_seq"] == 7
    assert done["tetriserve.length_prediction"].attributes["tetriserve.length.late"] is True
    assert done["tetriserve.length_prediction"].attributes["tetriserve.length.bucket"] == 1
    send = done["tetriserve.kv.send"]
    assert send.parent.span_id == prefill.context.span_id
    assert send.attributes["tetriserve.kv.bytes"] == 4096 and send.attributes["tetriserve.kv.backend"] == "shm"


def test_decode_spans_from_take_to_finish(exported: InMemorySpanExporter) -> None:
    root = tracing.start("tetriserve.request")
    req = Request("r-dec", (1, 2, 3), trace=tracing.traceparent(root))
    spans = DecodeSpans.open("decode-0", req, 1)
    tracing.link_key(req.kv_key, spans.span)
    assert tracing.key_parent(req.kv_key) is spans.span  # what the KV connector's load span goes under
    spans.first_token()
    spans.close(5, "length", None)
    spans.close(6, "error", "again")  # ended once
    done = _by_name(exported)
    decode = done["tetriserve.decode"]
    assert decode.parent.span_id == root.get_span_context().span_id
    assert (
        decode.attributes["tetriserve.output_tokens"] == 5 and decode.attributes["tetriserve.finish_reason"] == "length"
    )
    assert done["tetriserve.decode.admission"].parent.span_id == decode.context.span_id
    assert done["tetriserve.decode.run"].attributes["tetriserve.output_tokens"] == 4


def test_decode_admission_splits_into_pull_wait_engine_queue_and_first_step(exported: InMemorySpanExporter) -> None:
    arrived = tracing.now_ns()
    spans = DecodeSpans.open("decode-0", Request("r-split", (1, 2, 3)), 1, arrived, pulled=True)
    spans.queued()
    assert spans.on_added is not None
    spans.on_added()  # the engine loop calls it on its thread once vLLM has the request
    spans.first_token()
    spans.close(4, "length", None)
    done = _by_name(exported)
    decode = done["tetriserve.decode"]
    assert decode.start_time == arrived  # from the take's arrival, before the wait for the pull
    parts = [done[f"tetriserve.decode.{name}"] for name in ("pull_wait", "engine_queue", "first_step")]
    assert all(part.parent.span_id == decode.context.span_id for part in parts)
    admission = done["tetriserve.decode.admission"]
    assert admission.start_time == parts[0].start_time == arrived and parts[2].end_time == admission.end_time
    assert parts[0].end_time <= parts[1].start_time and parts[1].end_time == parts[2].start_time


def test_decode_spans_without_a_pull_or_the_engine_hook_record_only_what_they_saw(
    exported: InMemorySpanExporter,
) -> None:
    spans = DecodeSpans.open("decode-0", Request("r-bare", (1, 2)), 1)
    spans.first_token()
    spans.close(2, "stop", None)
    assert {s.name for s in exported.get_finished_spans()} == {
        "tetriserve.decode",
        "tetriserve.decode.admission",
        "tetriserve.decode.run",
    }


def test_decode_spans_are_shared_no_ops_when_off() -> None:
    spans = DecodeSpans.open("decode-0", Request("r", (1,)), 1)
    assert spans is NO_SPANS and not spans.span.is_recording()
    assert spans.on_added is None  # the engine loop gets no hook to call
    spans.queued()
    spans.first_token()
    spans.close(2, "stop", None)
