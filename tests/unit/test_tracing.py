"""``observability/tracing.py`` without Ray or vLLM: off is a no-op, on records spans (in-memory exporter), and the
trace context crosses processes as a W3C traceparent in the typed fields (pickled as Ray pickles them)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, StatusCode

from tetriserve.common.config import ClusterConfig
from tetriserve.common.request import Request
from tetriserve.common.stream import PlacementRequest
from tetriserve.common.tracing_config import TracingConfig
from tetriserve.observability import tracing

ON = TracingConfig(enabled=True)


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup(ON, "test", exporter)
    yield exporter
    tracing.shutdown()


def test_off_by_default_and_every_call_is_a_no_op() -> None:
    assert ClusterConfig().tracing.enabled is False
    assert tracing.setup(ClusterConfig().tracing, "test") is False
    assert not tracing.enabled()
    span = tracing.start("x", "00-" + "a" * 32 + "-" + "b" * 16 + "-01", {"k": 1})
    assert span is INVALID_SPAN and not span.is_recording()
    assert tracing.traceparent(span) is None
    tracing.record("y", None, tracing.now_ns(), {"k": 2})
    tracing.end(span, {"k": 3}, "boom")
    tracing.annotate({"k": 4})
    tracing.enter(span)
    tracing.link_key("key", span)
    assert tracing.key_parent("key") is None


def test_otel_sdk_disabled_wins_over_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.setup(ON, "test", InMemorySpanExporter()) is False
    assert not tracing.enabled()
    tracing.shutdown()


def test_spans_under_a_propagated_traceparent_share_the_trace(spans: InMemorySpanExporter) -> None:
    root = tracing.start("tetriserve.request", None, {"tetriserve.request_id": "r1"})
    header = tracing.traceparent(root)
    assert header is not None and header.startswith("00-") and int(header[-2:], 16) & 1  # sampled
    # another process: only the string crossed, inside the typed messages
    req = pickle.loads(pickle.dumps(Request("r1", (1, 2, 3), trace=header)))
    meta = pickle.loads(pickle.dumps(PlacementRequest("r1", 3, 8, 0.0, trace=req.trace)))
    started = tracing.now_ns()
    tracing.record("tetriserve.place", meta.trace, started, {"tetriserve.prefill_worker": "prefill-0"})
    child = tracing.start("tetriserve.prefill", req.trace)
    tracing.record("tetriserve.prefill.compute", child, tracing.now_ns())
    tracing.end(child, {"tetriserve.decode_worker": "decode-0"}, error="handoff failed")
    tracing.end(root)
    done = {s.name: s for s in spans.get_finished_spans()}
    assert set(done) == {"tetriserve.request", "tetriserve.place", "tetriserve.prefill", "tetriserve.prefill.compute"}
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in done.values()} == {trace_id}
    root_id = root.get_span_context().span_id
    assert done["tetriserve.place"].parent is not None and done["tetriserve.place"].parent.span_id == root_id
    assert done["tetriserve.place"].parent.is_remote
    assert done["tetriserve.prefill.compute"].parent.span_id == done["tetriserve.prefill"].context.span_id
    assert done["tetriserve.prefill"].status.status_code is StatusCode.ERROR
    assert done["tetriserve.prefill"].attributes["tetriserve.decode_worker"] == "decode-0"
    assert done["tetriserve.place"].start_time == started
    assert done["tetriserve.request"].resource.attributes["tetriserve.process"] == "test"


def test_enter_makes_a_span_the_parent_of_the_rest_of_the_task(spans: InMemorySpanExporter) -> None:
    import asyncio

    async def task() -> None:
        span = tracing.start("outer")
        tracing.enter(span)
        tracing.record("inner", None, tracing.now_ns())
        tracing.annotate({"tetriserve.decode_worker": "decode-1"})
        tracing.end(span)

    asyncio.run(task())
    done = {s.name: s for s in spans.get_finished_spans()}
    assert done["inner"].parent.span_id == done["outer"].context.span_id
    assert done["outer"].attributes["tetriserve.decode_worker"] == "decode-1"


def test_a_span_ends_once(spans: InMemorySpanExporter) -> None:
    span = tracing.start("once")
    tracing.end(span, {"a": 1})
    tracing.end(span, {"a": 2}, "late")
    (done,) = spans.get_finished_spans()
    assert done.attributes["a"] == 1 and done.status.status_code is StatusCode.UNSET


def test_sampling_is_decided_at_the_root_and_followed_downstream() -> None:
    exporter = InMemorySpanExporter()
    tracing.setup(TracingConfig(enabled=True, sample_ratio=0.0), "test", exporter)
    try:
        root = tracing.start("root")
        header = tracing.traceparent(root)
        assert header is not None and not int(header[-2:], 16) & 1  # propagated, marked not sampled
        tracing.record("child", header, tracing.now_ns())
        sampled = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"  # a client that samples this request
        tracing.record("followed", sampled, tracing.now_ns())
        tracing.end(root)
        assert [s.name for s in exporter.get_finished_spans()] == ["followed"]
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-" + "0" * 32 + "-" + "2" * 16 + "-01",  # all-zero trace id
        "00-" + "1" * 32 + "-" + "0" * 16 + "-01",  # all-zero span id
        "ff-" + "1" * 32 + "-" + "2" * 16 + "-01",  # forbidden version
        "00-" + "1" * 31 + "-" + "2" * 16 + "-01",
    ],
)
def test_invalid_traceparents_are_ignored(value: str | None, spans: InMemorySpanExporter) -> None:
    assert tracing.parse_traceparent(value) is None
    if value is not None:
        tracing.end(tracing.start("root-anyway", value))
        (done,) = spans.get_finished_spans()
        assert done.parent is None


def test_kv_keys_link_the_engine_thread_to_the_request(spans: InMemorySpanExporter) -> None:
    span = tracing.start("tetriserve.decode")
    tracing.link_key("r1@1", span)
    assert tracing.key_parent("r1@1") is span
    assert tracing.key_parent("r1@1") is None  # taken once
    for i in range(tracing.KEY_MEMORY + 10):
        tracing.link_key(f"k{i}", span)
    assert tracing.key_parent("k0") is None and tracing.key_parent(f"k{tracing.KEY_MEMORY + 9}") is span


def test_the_same_setup_again_keeps_the_tracer_and_another_replaces_it() -> None:
    exporter = InMemorySpanExporter()
    assert tracing.setup(ON, "p", exporter)
    tracing.end(tracing.start("a"))
    assert tracing.setup(ON, "p", exporter)  # a no-op: nothing was flushed away
    assert tracing.setup(TracingConfig(), "p") is False
    assert not tracing.enabled()
    assert [s.name for s in exporter.get_finished_spans()] == ["a"]
    tracing.shutdown()


@pytest.mark.parametrize(
    ("protocol", "endpoint", "expected"),
    [
        ("grpc", "collector:4317", "collector:4317"),
        ("grpc", "http://collector:4317", "collector:4317"),
        ("http", "collector:4318", "http://collector:4318/v1/traces"),
        ("http", "https://collector:4318/", "https://collector:4318/v1/traces"),
        ("http", "http://collector:4318/custom/path", "http://collector:4318/custom/path"),
    ],
)
def test_otlp_exporters_from_the_config(protocol: str, endpoint: str, expected: str) -> None:
    exporter = tracing.otlp_exporter(TracingConfig(enabled=True, protocol=protocol, endpoint=endpoint))  # type: ignore[arg-type]
    try:
        assert exporter._endpoint == expected  # type: ignore[attr-defined]
        if protocol == "grpc":
            assert exporter._insecure  # type: ignore[attr-defined]  # a bare host:port is plain text
    finally:
        exporter.shutdown()


def test_the_config_section_and_the_serve_flags() -> None:
    import argparse

    from tetriserve.cli.config_flags import add_config_flags, config_overrides

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    overrides = config_overrides(parser.parse_args(["--otlp-endpoint", "http://jaeger:4317"]))
    config = ClusterConfig.load(overrides=overrides)
    assert config.tracing == TracingConfig(enabled=True, endpoint="http://jaeger:4317")
    off = config_overrides(
        parser.parse_args(["--otlp-endpoint", "x:1", "--no-tracing", "--trace-sample-ratio", "0.5"])
    )
    assert ClusterConfig.load(overrides=off).tracing.enabled is False
    with pytest.raises(ValueError, match="sample_ratio"):
        ClusterConfig.load(overrides={"tracing.sample_ratio": 2})
    with pytest.raises(ValueError, match="protocol"):
        ClusterConfig.load(overrides={"tracing.protocol": "thrift"})
