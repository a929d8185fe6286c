"""Tests for common.workload: TetriInfer classes, request pools, arrival processes, phases, traces, SLOs."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from tetriserve.common.request import SLO
from tetriserve.common.workload import (
    Phase,
    Sample,
    Workload,
    WorkloadClass,
    WorkloadRequest,
    attained,
    build_workload,
    bursts,
    by_class,
    classify,
    goodput,
    phase_changing,
    poisson,
    sharegpt_pool,
    synthetic_pool,
    tetriinfer_workload,
    trace_replay,
    uniform,
)

LPLD, LPHD, HPLD, HPHD, MIXED = (
    WorkloadClass.LPLD,
    WorkloadClass.LPHD,
    WorkloadClass.HPLD,
    WorkloadClass.HPHD,
    WorkloadClass.MIXED,
)
LENGTHS = {LPLD: (100, 50), LPHD: (100, 300), HPLD: (1000, 50), HPHD: (1000, 300)}


def _pool(per_class: int = 10) -> list[Sample]:
    """``per_class`` distinct samples of each class (lengths vary by a few tokens so samples differ)."""
    return [Sample(f"{cls.value}-{i}", p + i, o + i) for cls, (p, o) in LENGTHS.items() for i in range(per_class)]


# ── classification ──────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("prompt", "output", "expected"),
    [(0, 0, LPLD), (512, 128, LPLD), (513, 128, HPLD), (512, 129, LPHD), (513, 129, HPHD), (5000, 1, HPLD)],
)
def test_classify_boundaries(prompt: int, output: int, expected: WorkloadClass) -> None:
    assert classify(prompt, output) is expected


def test_classify_custom_thresholds_and_bad_input() -> None:
    assert classify(11, 6, heavy_prompt=10, heavy_output=5) is HPHD
    assert classify(10, 5, heavy_prompt=10, heavy_output=5) is LPLD
    for kwargs, name in [
        ({"prompt_tokens": -1, "output_tokens": 0}, "prompt_tokens"),
        ({"prompt_tokens": 0, "output_tokens": -1}, "output_tokens"),
        ({"prompt_tokens": 0, "output_tokens": 0, "heavy_prompt": -1}, "heavy_prompt"),
        ({"prompt_tokens": 0, "output_tokens": 0, "heavy_output": -1}, "heavy_output"),
    ]:
        with pytest.raises(ValueError, match=name):
            classify(**kwargs)


def test_sample_and_request_validation() -> None:
    assert Sample("", 600, 10).cls is HPLD
    with pytest.raises(ValueError, match="prompt_tokens"):
        Sample("x", 0, 1)
    with pytest.raises(ValueError, match="output_tokens"):
        Sample("x", 1, 0)
    with pytest.raises(ValueError, match="cls"):
        WorkloadRequest(0, 0.0, "x", 1, 1, MIXED, SLO())
    with pytest.raises(ValueError, match="arrival_s"):
        WorkloadRequest(0, -1.0, "x", 1, 1, LPLD, SLO())
    with pytest.raises(ValueError, match="arrival_s"):
        WorkloadRequest(0, math.nan, "x", 1, 1, LPLD, SLO())


# ── arrival processes ───────────────────────────────────────────────────────────────────────────


def _non_decreasing(xs: list[float]) -> bool:
    return all(a <= b for a, b in itertools.pairwise(xs))


def test_poisson_count_order_determinism_and_mean_gap() -> None:
    rate, n = 4.0, 5000
    arrivals = poisson(rate, n, random.Random(7))
    assert len(arrivals) == n
    assert arrivals[0] == 0.0
    assert _non_decreasing(arrivals)
    assert arrivals == poisson(rate, n, random.Random(7))
    assert arrivals != poisson(rate, n, random.Random(8))
    mean_gap = arrivals[-1] / (n - 1)
    assert mean_gap == pytest.approx(1 / rate, rel=0.05)
    assert poisson(rate, 0, random.Random(0)) == []


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, math.inf])
def test_rate_must_be_positive_and_finite(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        poisson(rate, 3, random.Random(0))
    with pytest.raises(ValueError, match="rate"):
        uniform(rate, 3)


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="n must"):
        poisson(1.0, -1, random.Random(0))
    with pytest.raises(ValueError, match="n must"):
        uniform(1.0, -1)
    with pytest.raises(ValueError, match="n must"):
        bursts(-1, 2, 1.0)


def test_uniform_is_evenly_spaced() -> None:
    assert uniform(2.0, 4) == [0.0, 0.5, 1.0, 1.5]
    assert uniform(2.0, 0) == []


def test_bursts_at_once_and_spread() -> None:
    assert bursts(7, 3, 2.0) == [0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 4.0]
    spread = bursts(9, 3, 2.0, within_s=0.5, rng=random.Random(1))
    assert len(spread) == 9
    assert _non_decreasing(spread)
    for i, t in enumerate(spread):
        t0 = (i // 3) * 2.0
        assert t0 <= t <= t0 + 0.5
    assert spread == bursts(9, 3, 2.0, within_s=0.5, rng=random.Random(1))
    assert spread != bursts(9, 3, 2.0, within_s=0.5, rng=random.Random(2))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"burst_size": 0, "burst_interval_s": 1.0}, "burst_size"),
        ({"burst_size": 2, "burst_interval_s": 0.0}, "burst_interval_s"),
        ({"burst_size": 2, "burst_interval_s": math.nan}, "burst_interval_s"),
        ({"burst_size": 2, "burst_interval_s": 1.0, "within_s": 1.5}, "within_s"),
        ({"burst_size": 2, "burst_interval_s": 1.0, "within_s": -0.1}, "within_s"),
        ({"burst_size": 2, "burst_interval_s": 1.0, "within_s": 0.5}, "rng"),
    ],
)
def test_bursts_bad_input(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        bursts(4, **kwargs)


def test_trace_replay_sorts_offsets_and_speeds_up() -> None:
    assert trace_replay([10.0, 12.0, 11.0, 16.0]) == [0.0, 1.0, 2.0, 6.0]
    assert trace_replay([10.0, 12.0, 11.0, 16.0], speed=2.0) == [0.0, 0.5, 1.0, 3.0]
    assert trace_replay([0.25, 0.25]) == [0.0, 0.0]
    assert trace_replay([]) == []


@pytest.mark.parametrize(
    ("timestamps", "speed", "name"),
    [([1.0, -1.0], 1.0, "timestamps"), ([1.0, math.nan], 1.0, "timestamps"), ([1.0], 0.0, "speed")],
)
def test_trace_replay_bad_input(timestamps: list[float], speed: float, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        trace_replay(timestamps, speed)


# ── pools and selection ─────────────────────────────────────────────────────────────────────────


def test_synthetic_pool_ranges_text_and_determinism() -> None:
    pool = synthetic_pool(50, (600, 700), (1, 100), random.Random(3))
    assert len(pool) == 50
    for s in pool:
        assert 600 <= s.prompt_tokens <= 700 and 1 <= s.output_tokens <= 100
        assert len(s.prompt.split()) == s.prompt_tokens
        assert s.cls is HPLD
    assert pool == synthetic_pool(50, (600, 700), (1, 100), random.Random(3))
    assert synthetic_pool(5, (4, 4), (2, 2), random.Random(0))[0] == Sample("hello hello hello hello", 4, 2)
    with pytest.raises(ValueError, match="prompt_tokens"):
        synthetic_pool(1, (5, 4), (1, 1), random.Random(0))
    with pytest.raises(ValueError, match="output_tokens"):
        synthetic_pool(1, (1, 1), (0, 1), random.Random(0))


def test_by_class_draws_only_that_class_without_replacement() -> None:
    pool = _pool(10)
    picked = by_class(pool, LPHD, 8, random.Random(0))
    assert len(picked) == 8
    assert all(s.cls is LPHD for s in picked)
    assert len(set(picked)) == 8
    assert picked == by_class(pool, LPHD, 8, random.Random(0))


def test_by_class_falls_back_to_replacement_and_rejects_missing_class() -> None:
    pool = _pool(3)
    picked = by_class(pool, HPHD, 10, random.Random(0))
    assert len(picked) == 10
    assert all(s.cls is HPHD for s in picked)
    assert len(set(picked)) <= 3
    only_light = [s for s in pool if s.cls is LPLD]
    with pytest.raises(ValueError, match="cls=hpld"):
        by_class(only_light, HPLD, 1, random.Random(0))
    with pytest.raises(ValueError, match="n must"):
        by_class(pool, LPLD, -1, random.Random(0))


def test_by_class_mixed_draws_from_the_whole_pool() -> None:
    pool = _pool(10)
    picked = by_class(pool, MIXED, 40, random.Random(0))
    assert sorted(picked, key=pool.index) == pool


def _write_sharegpt(path: Path) -> Path:
    def turns(*pairs: tuple[str, str]) -> list[dict[str, str]]:
        return [{"from": who, "value": value} for who, value in pairs]

    records = [
        {"id": "a", "conversations": turns(("human", "what is two plus two"), ("gpt", "four"))},
        {"id": "no-answer", "conversations": turns(("human", "hello there"), ("human", "anyone"))},
        {"id": "gpt-first", "conversations": turns(("gpt", "hi"), ("human", "tell me a joke"), ("gpt", "no thanks"))},
        {"id": "empty-answer", "conversations": turns(("human", "say nothing"), ("gpt", "   "))},
        {"id": "d", "conversations": turns(("human", "one"), ("gpt", "a b c"), ("human", "x"), ("gpt", "y"))},
    ]
    text = json.dumps(records)
    path.write_text(text[: text.rindex("}") - 3], encoding="utf-8")  # truncated mid-record, like the packaged file
    return path


def test_sharegpt_pool_pairs_first_human_turn_with_its_answer(tmp_path: Path) -> None:
    path = _write_sharegpt(tmp_path / "sharegpt.json")
    assert sharegpt_pool(lambda s: len(s.split()), path=path) == [
        Sample("what is two plus two", 5, 1),
        Sample("tell me a joke", 4, 2),
    ]  # "no-answer" and "empty-answer" skipped; "d" is the truncated tail
    full = tmp_path / "full.json"
    record = {"id": "d", "conversations": [{"from": "human", "value": "one"}, {"from": "gpt", "value": "a b c"}]}
    full.write_text(json.dumps([record] * 3), encoding="utf-8")
    count = lambda s: len(s.split())  # noqa: E731
    assert sharegpt_pool(count, path=full) == [Sample("one", 1, 3)] * 3
    assert len(sharegpt_pool(count, limit=2, path=full)) == 2
    assert len(sharegpt_pool(count, path=full, max_scan=1)) == 1
    assert sharegpt_pool(count, limit=0, path=full) == []
    with pytest.raises(ValueError, match="limit"):
        sharegpt_pool(count, limit=-1, path=full)
    with pytest.raises(ValueError, match="max_scan"):
        sharegpt_pool(count, path=full, max_scan=-1)


# ── phases and workloads ────────────────────────────────────────────────────────────────────────


def test_build_workload_orders_indexes_and_chains_phases() -> None:
    phases = [
        Phase("one", LPLD, 5, rate=2.0, arrival="uniform", slo=SLO(ttft_ms=100.0)),
        Phase("two", HPHD, 4, rate=10.0),
        Phase("three", MIXED, 6, rate=1.0, arrival="burst", burst_size=3, burst_interval_s=4.0),
    ]
    w = build_workload(_pool(10), phases, seed=5)
    reqs = w.requests
    assert [r.index for r in reqs] == list(range(15))
    assert [r.phase for r in reqs] == ["one"] * 5 + ["two"] * 4 + ["three"] * 6
    assert w.phases() == ["one", "two", "three"]
    assert _non_decreasing([r.arrival_s for r in reqs])
    assert [r.arrival_s for r in reqs[:5]] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert reqs[5].arrival_s == pytest.approx(2.0 + 0.5)  # previous phase's last arrival + its mean gap
    assert reqs[9].arrival_s == pytest.approx(reqs[8].arrival_s + 0.1)
    assert [r.arrival_s - reqs[9].arrival_s for r in reqs[9:]] == pytest.approx([0, 0, 0, 4, 4, 4])
    assert all(r.slo == SLO(ttft_ms=100.0) for r in reqs[:5]) and all(r.slo == SLO() for r in reqs[5:])
    assert all(r.cls is LPLD for r in reqs[:5]) and all(r.cls is HPHD for r in reqs[5:9])
    assert all(r.cls is classify(r.prompt_tokens, r.output_tokens) for r in reqs)
    assert w.duration_s == reqs[-1].arrival_s
    assert w == build_workload(_pool(10), phases, seed=5)
    assert w != build_workload(_pool(10), phases, seed=6)


def test_burst_phase_default_interval_keeps_the_mean_rate() -> None:
    phase = Phase("b", LPLD, 4, rate=2.0, arrival="burst", burst_size=2)
    assert phase.gap_s == 1.0
    assert [r.arrival_s for r in build_workload(_pool(), [phase], 0).requests] == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"name": ""}, "name"),
        ({"count": 0}, "count"),
        ({"rate": 0.0}, "rate"),
        ({"arrival": "gamma"}, "arrival"),
        ({"arrival": "burst"}, "burst_size"),
    ],
)
def test_phase_validation(kwargs: dict[str, Any], name: str) -> None:
    args: dict[str, Any] = {"name": "p", "cls": LPLD, "count": 1, "rate": 1.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        Phase(**args)


def test_build_workload_rejects_empty_or_duplicate_phases() -> None:
    with pytest.raises(ValueError, match="phases"):
        build_workload(_pool(), [], seed=0)
    with pytest.raises(ValueError, match="phases"):
        build_workload(_pool(), [Phase("p", LPLD, 1, 1.0), Phase("p", HPLD, 1, 1.0)], seed=0)


def test_phase_changing_has_the_three_phases_and_class_mix() -> None:
    slo = SLO(ttft_ms=500.0, tbt_ms=50.0)
    w = phase_changing(_pool(20), per_phase=12, rate=8.0, seed=1, slo=slo)
    assert w.phases() == ["prefill-heavy", "decode-heavy", "mixed"]
    by_phase = {name: [r for r in w.requests if r.phase == name] for name in w.phases()}
    assert all(len(rs) == 12 for rs in by_phase.values())
    assert all(r.prompt_tokens > 512 and r.output_tokens <= 128 for r in by_phase["prefill-heavy"])
    assert all(r.prompt_tokens <= 512 and r.output_tokens > 128 for r in by_phase["decode-heavy"])
    assert len({r.cls for r in by_phase["mixed"]}) > 1
    assert all(r.slo == slo for r in w.requests)
    counts = w.counts_by_class()
    assert set(counts) == {LPLD, LPHD, HPLD, HPHD}
    assert sum(counts.values()) == 36 and counts[HPLD] >= 12 and counts[LPHD] >= 12


def test_tetriinfer_workload_is_one_class() -> None:
    w = tetriinfer_workload(_pool(200), HPHD, n=128, rate=4.0, seed=0, slo=SLO(jct_ms=10_000.0))
    assert len(w.requests) == 128
    assert w.counts_by_class() == {LPLD: 0, LPHD: 0, HPLD: 0, HPHD: 128}
    assert w.phases() == ["hphd"]
    assert len({r.prompt for r in w.requests}) == 128  # enough of the class: no repeats


def test_workload_rejects_bad_order() -> None:
    a = WorkloadRequest(0, 1.0, "a", 1, 1, LPLD, SLO())
    b = WorkloadRequest(1, 0.5, "b", 1, 1, LPLD, SLO())
    with pytest.raises(ValueError, match="requests"):
        Workload((a, b))
    with pytest.raises(ValueError, match="requests"):
        Workload((b,))
    assert Workload(()).duration_s == 0.0


def test_json_round_trip_and_trace_replay_reproduce_the_workload() -> None:
    pool = [*_pool(5), Sample('naïve 你好 🤖 "quoted"\n', 700, 20)]
    w = phase_changing(pool, per_phase=10, rate=3.3, seed=9, slo=SLO(ttft_ms=123.456, tbt_ms=None, jct_ms=1e4))
    text = w.to_json()
    assert Workload.from_json(text) == w
    arrivals = [r.arrival_s for r in w.requests]
    assert trace_replay(arrivals) == arrivals


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 2, "requests": []}',
        "[]",
        '{"version": 1, "requests": [{"index": 0}]}',
        '{"version": 1, "requests": [{"index": 0, "arrival_s": 0.0, "prompt": "", "prompt_tokens": 1, '
        '"output_tokens": 1, "cls": "mixed", "slo": {}, "phase": ""}]}',
    ],
)
def test_from_json_rejects_bad_documents(text: str) -> None:
    with pytest.raises(ValueError):
        Workload.from_json(text)


# ── SLO attainment ──────────────────────────────────────────────────────────────────────────────


def test_attained_edge_cases() -> None:
    assert attained(SLO(), None, None, None)
    slo = SLO(ttft_ms=100.0, tbt_ms=20.0)
    assert attained(slo, 100.0, 20.0, None)  # exactly at the objective counts as met; jct not set
    assert not attained(slo, 100.1, 20.0, 5.0)
    assert not attained(slo, 50.0, 20.5, 5.0)
    assert not attained(slo, 50.0, None, 5.0)  # a set objective without a measurement is missed
    assert not attained(slo, math.nan, 10.0, None)
    assert attained(SLO(jct_ms=1000.0), None, None, 999.0)


def test_goodput_counts_met_requests_per_second() -> None:
    reqs = build_workload(_pool(), [Phase("p", LPLD, 5, 1.0)], seed=0).requests
    results = list(zip(reqs, [True, False, True, True, False], strict=True))
    assert goodput(results, 2.0) == 1.5
    assert goodput([], 1.0) == 0.0
    with pytest.raises(ValueError, match="duration_s"):
        goodput(results, 0.0)
