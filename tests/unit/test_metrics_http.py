"""``GET /metrics`` on the HTTP front door over a fake backend, and `tetriserve top --once` reading it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import wait_until
from tests.gateway_support import FakeFrontDoors, fake_front_doors
from tetriserve.cli.main import main
from tetriserve.cli.top import quantile
from tetriserve.client import TetriServeClient

TTFT, E2E = "tetriserve:time_to_first_token_seconds_count{}", "tetriserve:e2e_request_latency_seconds_count{}"


@pytest.fixture(scope="module")
def env() -> Iterator[FakeFrontDoors]:
    with fake_front_doors() as env:
        yield env


def _scrape(url: str) -> dict[str, float]:
    """``name{label=value,...}`` -> value, for every sample."""
    resp = httpx.get(f"{url}/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_counters_and_histograms_move_after_requests(env: FakeFrontDoors) -> None:
    before = _scrape(env.url)
    body = {"model": "tiny-test", "prompt": "hello there", "max_tokens": 5}
    assert httpx.post(f"{env.url}/v1/completions", json=body, timeout=30).status_code == 200
    with TetriServeClient(env.target, timeout=30) as client:  # the gRPC front door counts in the same place
        assert list(client.generate("hi again", max_tokens=3))[-1].finish_reason == "length"
    # a snapshot serves the scrapes of one second: poll until the next one
    wait_until(lambda: _scrape(env.url)[TTFT] - before[TTFT] == 2, timeout=10, what="TTFT count +2")
    after = _scrape(env.url)
    assert after[E2E] - before[E2E] == 2
    assert after["tetriserve:generation_tokens_total{}"] - before["tetriserve:generation_tokens_total{}"] == 8
    assert after["tetriserve:inter_token_latency_seconds_count{}"] >= 6
    assert after["tetriserve:request_success_total{finished_reason=length}"] >= 2
    assert after["tetriserve:cluster_up{}"] == 1
    assert after["tetriserve:worker_role{role=prefill,worker=prefill-0}"] == 1
    assert after["tetriserve:num_requests_waiting{role=prefill,worker=prefill-0}"] == 1  # the fake's load report


def test_placement_refusal_is_counted(env: FakeFrontDoors) -> None:
    before = _scrape(env.url).get("tetriserve:request_refusals_total{reason=placement}", 0.0)
    env.backend.behavior.full_retry_after_s = 3
    try:
        body = {"model": "tiny-test", "prompt": "hello", "max_tokens": 2}
        assert httpx.post(f"{env.url}/v1/completions", json=body, timeout=30).status_code == 429
    finally:
        env.backend.reset()
    key = "tetriserve:request_refusals_total{reason=placement}"
    wait_until(lambda: _scrape(env.url).get(key, 0.0) == before + 1, timeout=10, what="a placement refusal")


def test_top_once_prints_a_frame(env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model": "tiny-test", "prompt": "hello", "max_tokens": 4}
    assert httpx.post(f"{env.url}/v1/completions", json=body, timeout=30).status_code == 200
    assert main(["top", "--once", "--url", env.url]) == 0
    out = capsys.readouterr().out
    assert "cluster up" in out and "TTFT p50" in out
    assert "prefill-0" in out and "decode-0" in out


def test_top_without_a_service_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--url", "http://127.0.0.1:9"]) == 1
    assert "no metrics at" in capsys.readouterr().err


def test_quantile_interpolates_like_promql() -> None:
    buckets = {"0.1": 0.0, "0.2": 10.0, "0.4": 20.0, "+Inf": 20.0}
    assert quantile(0.5, buckets) == pytest.approx(0.2)
    assert quantile(0.75, buckets) == pytest.approx(0.3)
    assert quantile(0.5, {"+Inf": 0.0}) is None
