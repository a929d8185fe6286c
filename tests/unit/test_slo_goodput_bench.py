"""The pure parts of ``benchmarks/slo_goodput.py``: the unloaded-latency fit and the SLOs drawn from it, which
objectives a request met, a point's summary, and DistServe's goodput search."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks import slo_goodput as sg


def test_the_unloaded_latency_fit_and_the_slos_it_gives() -> None:
    u = sg.fit_unloaded([(100, 0.020, 0.005), (300, 0.040, 0.006), (200, 0.030, None)])
    # mean p 200, mean TTFT 0.030; slope (-100·-0.01 + 100·0.01) / (100² + 100²) = 1e-4 s a token; 0.030 - 0.020
    assert math.isclose(u.ttft_b_s, 1e-4) and math.isclose(u.ttft_a_s, 0.010)
    assert math.isclose(u.tbt_s, 0.0055)  # the median of 5 and 6 ms; the one-token request has no gap
    slo = u.slo_ms(100, 11, scale=2, multiple=5)
    # factor 2·5 = 10: TTFT 10·(0.010 + 0.010) s, TBT 10·5.5 ms, JCT 10·(0.020 + 10·0.0055) s
    assert slo == pytest.approx({"ttft_ms": 200.0, "tbt_ms": 55.0, "jct_ms": 750.0})
    with pytest.raises(ValueError, match="two prompt lengths"):
        sg.fit_unloaded([(100, 0.02, 0.005), (100, 0.03, 0.005)])


def test_a_negative_slope_is_taken_as_flat() -> None:
    u = sg.fit_unloaded([(100, 0.030, 0.005), (300, 0.020, 0.005)])
    assert u.ttft_b_s == 0.0 and math.isclose(u.ttft_a_s, 0.025)  # the mean TTFT


def test_which_objectives_a_request_met() -> None:
    slo = {"ttft_ms": 200.0, "tbt_ms": 55.0, "jct_ms": 750.0}
    ok = sg.Outcome(100, 11, 11, ttft_s=0.150, tpot_s=0.050, jct_s=0.650)
    assert ok.met(slo) == {"ttft": True, "tbt": True, "jct": True, "all": True}
    slow = sg.Outcome(100, 11, 11, ttft_s=0.250, tpot_s=0.050, jct_s=0.760)
    assert slow.met(slo) == {"ttft": False, "tbt": True, "jct": False, "all": False}
    one = sg.Outcome(100, 1, 1, ttft_s=0.1, tpot_s=None, jct_s=0.1)  # one token: no gap to miss
    assert one.met(slo)["all"]
    cut = sg.Outcome(100, 11, 5, ttft_s=0.1, tpot_s=0.01, jct_s=0.2)  # fewer tokens than asked: misses all
    assert not any(cut.met(slo).values())


def test_a_point_s_summary() -> None:
    slo = {"ttft_ms": 200.0, "tbt_ms": 55.0, "jct_ms": 750.0}
    outcomes = [
        sg.Outcome(100, 11, 11, 0.100, 0.050, 0.600),
        sg.Outcome(100, 11, 11, 0.300, 0.040, 0.700),
        sg.Outcome(100, 11, 0, None, None, None, "HTTP 429"),
        sg.Outcome(100, 11, 11, 0.150, 0.060, 0.740),
    ]
    s = sg.summarize(outcomes, [slo] * 4)
    # TTFT met by 1 and 4; TBT by 1 and 2; JCT by 1, 2 and 4; all by 1 only; over the 4 sent
    assert (s["attain_ttft"], s["attain_tbt"], s["attain_jct"], s["attain_all"]) == (0.5, 0.5, 0.75, 0.25)
    assert s["incomplete"] == 1 and s["requests"] == 4
    assert math.isclose(s["ttft_p50_ms"], 150.0)  # the middle of 100, 150, 300
    assert math.isclose(s["tpot_p99_ms"], 59.8)  # 50 + 0.98·(60 - 50) between the two largest


def test_the_goodput_search_doubles_then_bisects() -> None:
    probed: list[float] = []

    def probe(rate: float) -> float:
        probed.append(rate)
        return 1.0 if rate <= 10 else 0.5

    assert sg.search(probe, start=4, steps=2) == sg.Bracket(10.0, 12.0)
    assert probed == [4, 8, 16, 12, 10]  # 16 misses: [8, 16] -> 12 misses -> 10 meets
    probed.clear()
    assert sg.search(probe, start=40, steps=2) == sg.Bracket(10.0, 12.5)
    assert probed == [40, 20, 10, 15, 12.5]  # halving to the first meet, then [10, 20] bisected twice


def test_a_search_that_never_meets_stops_at_the_floor() -> None:
    probed: list[float] = []

    def probe(rate: float) -> float:
        probed.append(rate)
        return 0.0

    assert sg.search(probe, start=4, steps=2, floor=0.5) == sg.Bracket(None, 0.5)
    assert probed == [4, 2, 1, 0.5]


def test_every_point_leads_its_prompts_with_its_own_ids() -> None:
    pairs = [((1, 2, 3), 5), ((4, 5), 7)]
    a = sg.arrivals(pairs, rate=2.0, seed=0, point=3001)
    assert [x.prompt for x in a] == [(101, 101, 1, 2, 3), (101, 101, 4, 5)]  # 100 + 3001 % 3000, 100 + 3001 // 3000
    assert [x.max_tokens for x in a] == [5, 7]
    again = sg.arrivals(pairs, rate=2.0, seed=0, point=0)
    assert [x.offset_s for x in again] == [x.offset_s for x in a]  # the same arrival times at a rate
    assert again[0].prompt[:2] == (100, 100)


def test_the_warm_up_leads_its_prompts_with_ids_no_measured_request_uses() -> None:
    pairs = [((i, i + 1), 4) for i in range(200)]
    warm = sg.warmup_arrivals(pairs)
    assert len(warm) == sg.WARMUP and all(a.offset_s == 0.0 for a in warm)  # all at once
    assert {a.prompt[0] for a in warm} <= set(range(4000, 4096)) and all(a.prompt[1] == 4001 for a in warm)
    assert warm[0].prompt[2:] == pairs[0][0] and warm[0].max_tokens == 4


def test_a_stream_whose_tokens_came_together_did_not_stream() -> None:
    def outcome(chunks: int, tokens: int = 10) -> sg.Outcome:
        return sg.Outcome(100, 10, tokens, 0.01, 0.002, 0.03, None, chunks)

    assert outcome(10).streamed and outcome(9).streamed  # a token or so merged on the way
    assert not outcome(2).streamed  # the answer held up and sent at once: the server's delay, not the engine's
    assert not outcome(10, tokens=9).streamed  # incomplete


def test_calibration_requests_spread_over_the_prompt_lengths() -> None:
    pairs = [((0,) * n, 4) for n in (5, 1, 9, 3, 7)]
    assert [len(ids) for ids, _ in sg.spread(pairs, 3)] == [1, 5, 9]
    assert [len(ids) for ids, _ in sg.spread(pairs, 1)] == [1]


def test_the_plot_draws_every_point_per_scale(tmp_path: Any) -> None:
    point = {"rate": 4.0, "attain_all": 0.95}
    data = {
        "args": {"scales": [1.0, 2.0], "target": 0.9},
        "systems": {"vllm": {"1": {"points": [point, {**point, "rate": 8.0, "attain_all": 0.5}]}}},
    }
    sg.plot(data, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
