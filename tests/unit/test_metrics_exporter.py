"""The metrics exporter fed stats objects (no Ray, no vLLM): Prometheus text, the Ray publisher, length scores."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tetriserve.common.length import LengthEstimate
from tetriserve.common.length_score import LengthScore, outcome
from tetriserve.engine.stats import EngineStats
from tetriserve.frontdoor.backend import WorkerStatus
from tetriserve.observability.metrics import RayPublisher, render
from tetriserve.observability.metrics_stats import ClusterStats, Histogram, MetricsSnapshot, worker_stats
from tetriserve.observability.request_metrics import RequestMetrics
from tetriserve.transport.api import TransportStats


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _front() -> RequestMetrics:
    m = RequestMetrics()
    m.first_token(0.03)
    m.tokens(0.2, 4)  # four tokens in one chunk: four gaps of 50 ms
    m.finished("length", prompt_tokens=7, generated=5, e2e_s=0.43, ttft_s=0.03)
    m.finished("error", prompt_tokens=3, generated=0, e2e_s=0.1, ttft_s=None, error="unavailable")
    m.aborted("disconnect", prompt_tokens=2, generated=1)
    m.refused("placement")
    return m


class _Gate:
    refused, inflight, queued = 2, 3, 1


def _cluster() -> ClusterStats:
    score = LengthScore()
    score.observe(LengthEstimate(10, 20, 30, bucket=0, source="trained"), 25)
    score.observe(LengthEstimate(10, 20, 30, bucket=0, source="trained"), 31)
    decode_raw = {
        "engine": EngineStats(
            running=2,
            waiting=1,
            kv_usage=0.25,
            preemptions=3,
            generation_tokens=40,
            prompt_tokens_external=12,
            step_seconds=2.0,
            step_cpu_seconds=1.5,
            steps=40,
            borrowed_steps=7,
            step_sleeps=90,
            step_preemptions=11,
        ),
        "transport": TransportStats(bytes_received=4096, transfers_received=2),
        "length_score": score.snapshot(),
    }
    prefill_raw = {
        "engine": EngineStats(prompt_tokens_computed=100, generation_tokens=2),
        "transport": TransportStats(bytes_sent=4096, transfers_sent=2, transfers_failed=1, seconds_sending=0.5),
        "predictions": {"on_time": 1, "late": 1, "refined": 0, "pending": 0},
        "handoffs": {"pipelined": 2, "whole": 1},
        "decisions": {"sola": {"reordered": 3}},
    }
    prefill_load = {"queued": 4.0, "running": 1.0, "queue_wait_s": 2.5, "seconds_per_token": 1.5e-4}
    prefill = WorkerStatus("prefill-0", "prefill", "active", prefill_load, flips=1)
    decode = WorkerStatus("decode-0", "decode", "active", {"running": 2.0, "queued": 1.0}, restarts=2)
    silent = WorkerStatus("decode-1", "decode", "active", {"running": 0.0, "queued": 0.0})
    workers = (worker_stats(prefill, prefill_raw), worker_stats(decode, decode_raw), worker_stats(silent, None))
    return ClusterStats(workers, 5, {"admitted": 9, "moved": 1}, {"worker_lost": 2})


def test_front_door_and_cluster_series() -> None:
    text = render(MetricsSnapshot(_front().snapshot(_Gate()), _cluster())).decode()
    s = _samples(text)
    assert s[("tetriserve:time_to_first_token_seconds_count", ())] == 1
    assert s[("tetriserve:time_to_first_token_seconds_bucket", (("le", "0.04"),))] == 1
    assert s[("tetriserve:time_to_first_token_seconds_bucket", (("le", "0.02"),))] == 0
    assert s[("tetriserve:inter_token_latency_seconds_count", ())] == 4
    assert s[("tetriserve:inter_token_latency_seconds_sum", ())] == pytest.approx(0.2)
    assert s[("tetriserve:time_per_output_token_seconds_sum", ())] == pytest.approx(0.1)  # (0.43 - 0.03) / 4
    assert s[("tetriserve:e2e_request_latency_seconds_count", ())] == 2
    assert s[("tetriserve:prompt_tokens_total", ())] == 12 and s[("tetriserve:generation_tokens_total", ())] == 6
    assert s[("tetriserve:request_success_total", (("finished_reason", "length"),))] == 1
    assert s[("tetriserve:request_errors_total", (("reason", "unavailable"),))] == 1
    assert s[("tetriserve:request_aborts_total", (("reason", "disconnect"),))] == 1
    assert s[("tetriserve:request_refusals_total", (("reason", "admission"),))] == 2
    assert s[("tetriserve:request_refusals_total", (("reason", "placement"),))] == 1
    assert s[("tetriserve:request_migrations_total", (("reason", "worker_lost"),))] == 2
    assert s[("tetriserve:request_migrations_total", (("reason", "slice_move"),))] == 1
    assert s[("tetriserve:frontdoor_requests_running", ())] == 2
    assert s[("tetriserve:cluster_up", ())] == 1 and s[("tetriserve:requests_in_flight", ())] == 5
    p, d = (("role", "prefill"), ("worker", "prefill-0")), (("role", "decode"), ("worker", "decode-0"))
    assert s[("tetriserve:num_requests_waiting", p)] == 4 and s[("tetriserve:num_requests_running", d)] == 2
    assert s[("tetriserve:kv_cache_usage_perc", d)] == 0.25
    assert s[("tetriserve:prefill_queue_wait_seconds", p)] == 2.5
    assert s[("tetriserve:prefill_seconds_per_token", p)] == 1.5e-4
    assert ("tetriserve:prefill_queue_wait_seconds", d) not in s  # a decode worker has no prefill queue
    assert s[("tetriserve:num_preemptions_total", d)] == 3
    assert s[("tetriserve:engine_step_seconds_total", (("clock", "wall"), *d))] == 2.0
    assert s[("tetriserve:engine_step_seconds_total", (("clock", "cpu"), *d))] == 1.5
    assert s[("tetriserve:engine_steps_total", d)] == 40
    assert s[("tetriserve:engine_borrowed_steps_total", d)] == 7
    assert s[("tetriserve:engine_step_context_switches_total", (("kind", "slept"), *d))] == 90
    assert s[("tetriserve:engine_step_context_switches_total", (("kind", "preempted"), *d))] == 11
    assert s[("tetriserve:engine_prompt_tokens_total", (*p[:1], ("source", "computed"), p[1]))] == 100
    assert s[("tetriserve:kv_transfer_bytes_total", (("direction", "sent"), *p))] == 4096
    assert s[("tetriserve:kv_transfer_bytes_total", (("direction", "received"), *d))] == 4096
    assert s[("tetriserve:kv_transfer_seconds_total", p)] == 0.5
    assert s[("tetriserve:kv_transfer_failures_total", p)] == 1
    assert s[("tetriserve:worker_role", (("role", "prefill"), ("worker", "prefill-0")))] == 1
    assert s[("tetriserve:worker_role", (("role", "decode"), ("worker", "prefill-0")))] == 0
    assert s[("tetriserve:worker_flips_total", (("worker", "prefill-0"),))] == 1
    assert s[("tetriserve:worker_restarts_total", (("worker", "decode-0"),))] == 2
    within = (("outcome", "within"), ("predictor", "trained"), *d)
    assert s[("tetriserve:length_predictions_total", within)] == 1
    assert s[("tetriserve:length_predictions_total", (("outcome", "over"), ("predictor", "trained"), *d))] == 1
    assert s[("tetriserve:length_prediction_abs_error_tokens_total", (("predictor", "trained"), *d))] == 16
    assert s[("tetriserve:length_prediction_timing_total", (*p[:1], ("timing", "late"), p[1]))] == 1
    assert s[("tetriserve:kv_handoffs_total", (("mode", "pipelined"), *p))] == 2
    sola = (("decision", "reordered"), ("policy", "sola"), *p)
    assert s[("tetriserve:policy_decisions_total", sola)] == 3
    silent = (("role", "decode"), ("worker", "decode-1"))
    assert ("tetriserve:num_requests_running", silent) in s  # from its load report
    assert ("tetriserve:kv_cache_usage_perc", silent) not in s  # its engine did not answer: no made-up zero


def test_cluster_down_keeps_the_front_doors_figures() -> None:
    s = _samples(render(MetricsSnapshot(_front().snapshot(), None)).decode())
    assert s[("tetriserve:cluster_up", ())] == 0
    assert s[("tetriserve:generation_tokens_total", ())] == 6
    assert not any(name == "tetriserve:num_requests_running" for name, _ in s)


def test_every_family_is_described_even_empty() -> None:
    text = render(MetricsSnapshot(RequestMetrics().snapshot(), None)).decode()
    assert "# TYPE tetriserve:kv_cache_usage_perc gauge" in text
    assert "# TYPE tetriserve:num_preemptions_total counter" in text


def test_length_score_outcomes() -> None:
    est = LengthEstimate(100, 150, 200, bucket=0)
    assert [outcome(est, n) for n in (99, 100, 199, 200)] == ["under", "within", "within", "over"]
    assert outcome(LengthEstimate(5, 5, 5), 5) == "within"
    score = LengthScore()
    score.observe(None, 10)
    assert score.snapshot().counts == {}


def test_histogram_rejects_unordered_bounds_and_drains() -> None:
    with pytest.raises(ValueError, match="bounds"):
        Histogram((1.0, 0.5))
    h = Histogram((1.0,))
    h.observe(0.5, 3)
    h.observe(2.0)
    assert h.snapshot().counts == (3, 1) and h.drain() == [(0.5, 3), (2.0, 1)] and h.drain() == []


class _FakeRayMetric:
    made: dict[str, _FakeRayMetric] = {}

    def __init__(self, name: str, description: str = "", boundaries: Any = None, tag_keys: Any = ()) -> None:
        assert ":" not in name and name.startswith("tetriserve_")
        self.name, self.tag_keys, self.calls = name, tuple(tag_keys), []
        _FakeRayMetric.made[name] = self

    def inc(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert set(tags or {}) == set(self.tag_keys)
        self.calls.append(("inc", value, tags))

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("set", value, tags))

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("observe", value, tags))


def test_ray_publisher_counts_increases_sets_gauges_and_replays_observations(monkeypatch: Any) -> None:
    fake = types.ModuleType("ray.util.metrics")
    fake.Counter = fake.Gauge = fake.Histogram = _FakeRayMetric  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.util.metrics", fake)
    _FakeRayMetric.made.clear()
    front = _front()
    pub = RayPublisher()
    snap = MetricsSnapshot(front.snapshot(), _cluster())
    pub.publish(snap, {"inter_token_latency_seconds": front.itl.drain()})
    pub.publish(snap, {"inter_token_latency_seconds": front.itl.drain()})  # nothing new: no increase
    made = _FakeRayMetric.made
    assert made["tetriserve_generation_tokens"].calls == [("inc", 6.0, {})]
    assert [c[0] for c in made["tetriserve_kv_cache_usage_perc"].calls] == ["set"] * 4  # 2 workers answered x 2
    assert made["tetriserve_inter_token_latency_seconds"].calls == [("observe", 0.05, None)] * 4
    assert "tetriserve_worker_role" not in made  # observability/worker_gauges.py publishes it to Ray


def test_a_worker_without_a_load_report_counts_its_engine_s_running_and_waiting() -> None:
    from tetriserve.observability.metrics_stats import worker_stats

    starting = WorkerStatus("decode-2", "decode", "active", {})  # no load report yet
    stats = worker_stats(starting, {"engine": EngineStats(running=3, waiting=2)})
    assert (stats.running, stats.waiting, stats.answered) == (3, 2, True)
