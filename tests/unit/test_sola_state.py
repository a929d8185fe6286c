"""SOLA §4.3's state monitor (common/sola_state.py): request latencies, p_i, D_i and m_ratio by hand."""

from __future__ import annotations

import pytest

from tetriserve.common.sola_state import LengthDistribution, Observed, RequestState, StateMonitor, SystemState


def test_a_prompt_still_computing_has_ttft_growing_with_now_and_no_tpot() -> None:
    mon = StateMonitor()
    s = mon.update(10.0, [Observed("a", arrival=9.5, prompt_len=100, max_tokens=20, ttft_slo_s=1.0)])
    a = s.get("a")
    assert a is not None
    assert a.t_ttft == pytest.approx(0.5)  # 10.0 − 9.5
    assert a.t_tpot == 0.0
    assert a.prefilling
    assert s.p_ttft == pytest.approx(0.5)  # 0.5 s / 1.0 s
    assert s.p_tpot == 0.0  # no request has a TPOT yet


def test_first_token_freezes_ttft_and_tpot_counts_the_tokens_after_it() -> None:
    mon = StateMonitor()
    mon.update(0.0, [Observed("a", 0.0, 100, 20, ttft_slo_s=1.0, tpot_slo_s=0.1)])
    mon.update(0.4, [Observed("a", 0.0, 100, 20, generated=1, ttft_slo_s=1.0, tpot_slo_s=0.1)])  # first token
    s = mon.update(1.0, [Observed("a", 0.0, 100, 20, generated=4, ttft_slo_s=1.0, tpot_slo_s=0.1)])
    a = s.get("a")
    assert a is not None
    assert a.t_ttft == pytest.approx(0.4)  # first token at 0.4 − arrival 0.0
    assert a.t_tpot == pytest.approx(0.2)  # (1.0 − 0.4) / (4 − 1)
    assert s.p_ttft == pytest.approx(0.4)  # 0.4 / 1.0
    assert s.p_tpot == pytest.approx(2.0)  # 0.2 / 0.1
    assert a.l_left == 16  # no D_i yet, no estimate: max_tokens 20 − 4


def test_p_is_the_largest_ratio_to_each_requests_own_slo() -> None:
    reqs = [
        RequestState("a", t_ttft=0.3, t_tpot=0.05, l_out=5, l_left=5, l_in=10, ttft_slo_s=1.0, tpot_slo_s=0.1),
        RequestState("b", t_ttft=0.3, t_tpot=0.05, l_out=5, l_left=5, l_in=10, ttft_slo_s=0.5, tpot_slo_s=0.2),
        RequestState("c", t_ttft=9.0, t_tpot=9.0, l_out=5, l_left=5, l_in=10),  # no SLO: in neither maximum
    ]
    s = SystemState.of(0.0, reqs)
    assert s.p_ttft == pytest.approx(0.6)  # max(0.3/1.0, 0.3/0.5)
    assert s.p_tpot == pytest.approx(0.5)  # max(0.05/0.1, 0.05/0.2)
    assert s.ttft_share_met == 1.0  # both within
    assert s.tpot_share_met == 1.0


def test_share_met_is_the_a_percent_of_requests_within_their_slo() -> None:
    reqs = [
        RequestState("a", 2.0, 0.0, 0, 5, 10, ttft_slo_s=1.0),  # ratio 2.0, missed
        RequestState("b", 0.5, 0.0, 0, 5, 10, ttft_slo_s=1.0),  # 0.5, met
        RequestState("c", 0.9, 0.0, 0, 5, 10, ttft_slo_s=1.0),  # 0.9, met
        RequestState("d", 1.5, 0.0, 0, 5, 10, ttft_slo_s=1.0),  # 1.5, missed
    ]
    assert SystemState.of(0.0, reqs).ttft_share_met == pytest.approx(0.5)  # 2 of 4


def test_m_ratio_is_the_used_share_of_the_kv_blocks() -> None:
    s = StateMonitor().update(0.0, [], used_blocks=30, total_blocks=120)
    assert s.m_ratio == pytest.approx(0.25)  # 30 / 120


def test_finished_requests_form_the_length_distribution_that_predicts_l_left() -> None:
    mon = StateMonitor()
    for rid, n in (("a", 10), ("b", 30), ("c", 50)):  # three requests of prompt 100, max_tokens 64 finish
        mon.update(0.0, [Observed(rid, 0.0, 100, 64, generated=n)])
        mon.update(1.0, [])
    assert len(mon.distribution) == 3
    # a new one in the same ranges (prompt 64..127, max_tokens 64..127) with 20 tokens out:
    # lengths above 20 are 30 and 50, median 40, so 40 − 20 = 20 left
    s = mon.update(2.0, [Observed("d", 1.5, 120, 100, generated=20, estimate=90)])
    d = s.get("d")
    assert d is not None and d.l_left == 20
    # in another input range D_i has nothing: the estimate 90 − 20 generated
    s = mon.update(3.0, [Observed("e", 2.5, 300, 100, generated=20, estimate=90)])
    e = s.get("e")
    assert e is not None and e.l_left == 70


def test_distribution_keeps_the_last_lengths_of_a_range() -> None:
    dist = LengthDistribution(kept=2)
    for n in (100, 4, 6):  # the 100 is pushed out
        dist.record(10, 16, n)
    assert dist.predict_left(10, 16, 0) == 5  # median(4, 6) − 0
    assert dist.predict_left(10, 16, 6) is None  # none longer than 6
