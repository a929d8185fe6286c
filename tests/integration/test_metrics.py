"""``GET /metrics`` on the real cluster: parsed with prometheus_client's parser, counters move after a request."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import wait_until
from tetriserve.cli.main import main

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    resp = httpx.get(f"{url}/metrics", timeout=30)
    assert resp.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, k), v in samples.items() if n == f"tetriserve:{name}" and want <= set(k))


def test_metrics_move_after_a_request(frontend: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cl = frontend.cluster
    prefill, decode = next(iter(cl.prefill)), next(iter(cl.decode))
    usage = [("tetriserve:kv_cache_usage_perc", (("role", role), ("worker", w))) for w, role in ((prefill, "prefill"),
             (decode, "decode"))]  # fmt: skip

    scrapes: list[Samples] = []

    def answered() -> bool:
        """The cluster and both workers' stats made it into the scrape (a process's first Ray calls to an actor
        take seconds: the first scrapes may go without them)."""
        scrapes.append(_scrape(frontend.http_url))
        return _sum(scrapes[-1], "cluster_up") == 1 and all(key in scrapes[-1] for key in usage)

    wait_until(answered, timeout=60, what="every worker in /metrics")
    before = scrapes[-1]
    assert _sum(before, "worker_role", worker=prefill, role="prefill") == 1
    assert _sum(before, "worker_role", worker=decode, role="decode") == 1

    body = {"model": "tiny-llama", "prompt": "Tell me about metrics.", "max_tokens": 8, "ignore_eos": True}
    resp = httpx.post(f"{frontend.http_url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text

    def moved() -> bool:
        ttft = "time_to_first_token_seconds_count"
        return answered() and _sum(scrapes[-1], ttft) == _sum(before, ttft) + 1

    wait_until(moved, timeout=30, what="the request in /metrics")
    after = scrapes[-1]

    def delta(name: str, **labels: str) -> float:
        return _sum(after, name, **labels) - _sum(before, name, **labels)

    assert delta("e2e_request_latency_seconds_count") == 1
    assert delta("time_per_output_token_seconds_count") == 1
    assert delta("inter_token_latency_seconds_count") == 7  # 8 tokens: 7 gaps after the first
    assert delta("generation_tokens_total") == 8
    assert delta("prompt_tokens_total") > 0
    assert delta("request_success_total", finished_reason="length") == 1
    # the workers' own counters (their stats, read per scrape)
    assert delta("engine_prompt_tokens_total", worker=prefill, source="computed") > 0
    assert delta("engine_generation_tokens_total", worker=decode) >= 7
    for w in (prefill, decode):  # time inside the engine's steps, by the wall clock and the thread's CPU clock
        wall, cpu = (delta("engine_step_seconds_total", worker=w, clock=c) for c in ("wall", "cpu"))
        assert 0 < cpu <= wall + 1e-3, (w, wall, cpu)
        assert delta("engine_steps_total", worker=w) >= 1
        for kind in ("slept", "preempted"):  # the stepping thread's context switches inside its steps
            name = "tetriserve:engine_step_context_switches_total"
            assert any(n == name and {("kind", kind), ("worker", w)} <= set(k) for n, k in after), (w, kind)
            assert delta("engine_step_context_switches_total", worker=w, kind=kind) >= 0
    assert delta("kv_transfer_bytes_total", worker=prefill, direction="sent") > 0
    assert delta("kv_transfer_bytes_total", worker=decode, direction="received") > 0
    assert delta("kv_transfers_total", worker=prefill, direction="sent") >= 1
    assert delta("kv_transfer_seconds_total", worker=prefill) > 0
    assert delta("length_predictions_total", worker=decode) == 1  # scored against its 8 tokens
    assert _sum(after, "scheduler_requests_total", outcome="admitted") >= 1

    assert main(["top", "--once", "--url", frontend.http_url]) == 0
    frame = capsys.readouterr().out
    assert "cluster up" in frame and prefill in frame and decode in frame


def test_ray_publisher_takes_the_same_snapshot(frontend: Any) -> None:
    """The Ray side (``ray.util.metrics``) accepts every series and histogram of a real snapshot."""
    from tetriserve.observability.metrics import MetricsExporter, RayPublisher
    from tetriserve.observability.request_metrics import RequestMetrics

    class _Front:
        metrics = RequestMetrics()
        gate = None

    _Front.metrics.first_token(0.1)
    _Front.metrics.tokens(0.05, 2)
    exporter = MetricsExporter(_Front(), frontend.admin)
    snap = frontend.loop.run(exporter.snapshot())
    assert snap.cluster is not None and len(snap.cluster.workers) == 2
    publisher = RayPublisher()
    publisher.publish(snap, exporter._drained())
    publisher.publish(snap, exporter._drained())


def test_ray_exports_the_series(frontend: Any) -> None:
    """The serving process's Ray publisher (every 10 s) reaches Ray's own metrics export, where the dashboard's
    Prometheus reads it: ``ray_tetriserve_<name>``."""
    import ray

    node = ray._private.worker.global_worker.node
    port = getattr(node, "metrics_export_port", None)
    if not port:
        pytest.skip("this Ray node exports no metrics")
    url = f"http://{ray.util.get_node_ip_address()}:{port}/metrics"
    body = {"model": "tiny-llama", "prompt": "Ray metrics, please.", "max_tokens": 4, "ignore_eos": True}
    assert httpx.post(f"{frontend.http_url}/v1/completions", json=body, timeout=120).status_code == 200

    def exported() -> bool:
        text = httpx.get(url, timeout=10).text
        return "ray_tetriserve_generation_tokens" in text and "ray_tetriserve_time_to_first_token_seconds" in text

    wait_until(exported, timeout=90, what=f"ray_tetriserve_* series at {url}")
