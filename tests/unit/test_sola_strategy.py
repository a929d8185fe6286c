"""SOLA §4.4.1's switch between the two constrained problems (common/sola_strategy.py), from built states."""

from __future__ import annotations

import math

import pytest

from tetriserve.common.sola_state import RequestState, SystemState
from tetriserve.common.sola_strategy import ProblemSwitch, choose, level_max


def _state(ttft: list[float], tpot: list[float]) -> SystemState:
    """Requests with SLO 1.0 s for both, so each t is its own ratio."""
    reqs = [RequestState(f"p{i}", t, 0.0, 0, 10, 10, ttft_slo_s=1.0) for i, t in enumerate(ttft)]
    reqs += [RequestState(f"d{i}", 0.1, t, 5, 10, 10, tpot_slo_s=1.0) for i, t in enumerate(tpot)]
    return SystemState.of(0.0, reqs)


def test_row_one_tpot_less_fulfilled_both_within() -> None:
    # (1) 1 > p^TPOT = 0.8 > p^TTFT = 0.3: optimise TPOT s.t. TTFT
    problem = choose(0.3, 0.8)
    assert problem.objective == "tpot" and problem.level == 1.0


def test_row_one_tpot_missed_ttft_within() -> None:
    # (2) p^TPOT = 1.5 > 1 > p^TTFT = 0.3: optimise TPOT s.t. TTFT
    assert choose(0.3, 1.5).objective == "tpot"


def test_row_two_ttft_less_fulfilled() -> None:
    # (1) 1 > 0.9 > 0.2 and (2) 1.4 > 1 > 0.2: optimise TTFT s.t. TPOT
    assert choose(0.9, 0.2).objective == "ttft"
    assert choose(1.4, 0.2).objective == "ttft"


def test_a_tie_and_no_slo_at_all_put_prefill_first() -> None:
    assert choose(0.0, 0.0).objective == "ttft"  # no request with an SLO
    assert choose(0.5, 0.5).objective == "ttft"


def test_row_three_both_missed_optimises_the_worse_and_loosens_the_other_to_a_percent() -> None:
    # TTFT ratios 2.5 (worst); TPOT ratios 0.5, 0.7, 1.2, 1.6: 2 of 4 within, a = 0.5
    s = _state([2.5], [0.5, 0.7, 1.2, 1.6])
    problem = choose(s.p_ttft, s.p_tpot, s)  # p^TTFT 2.5 > p^TPOT 1.6 > 1
    assert problem.objective == "ttft"
    assert problem.level == pytest.approx(0.5)
    assert problem.loosened


def test_row_three_the_other_way_round() -> None:
    # TPOT ratio 3.0 the worst; TTFT ratios 0.4, 1.1, 1.2: 1 of 3 within, a = 1/3
    s = _state([0.4, 1.1, 1.2], [3.0])
    problem = choose(s.p_ttft, s.p_tpot, s)
    assert problem.objective == "tpot"
    assert problem.level == pytest.approx(1 / 3)


def test_row_three_with_none_within_loosens_to_one_request() -> None:
    s = _state([2.0, 3.0], [1.5, 1.2])  # nobody meets either SLO; TTFT worse (3.0 > 1.5)
    problem = choose(s.p_ttft, s.p_tpot, s)
    assert problem.objective == "ttft"
    assert problem.level == pytest.approx(0.5)  # one request of two TPOT ones


def test_level_max_is_the_ceil_a_n_th_smallest() -> None:
    values = [0.9, 0.2, 1.4, 0.5]  # sorted 0.2 0.5 0.9 1.4
    assert level_max(values) == 1.4  # a = 1: the maximum
    assert level_max(values, 0.5) == 0.5  # ⌈0.5·4⌉ = 2nd smallest
    assert level_max(values, 0.6) == 0.9  # ⌈0.6·4⌉ = ⌈2.4⌉ = 3rd
    assert level_max(values, 0.25) == 0.2  # ⌈0.25·4⌉ = 1st
    assert level_max([], 0.5) == -math.inf  # no constraint terms: nothing to break


def test_the_window_smooths_a_sudden_change() -> None:
    switch = ProblemSwitch(window=3)
    assert switch.decide(_state([0.8], [0.1])).objective == "ttft"  # means: 0.8 vs 0.1
    assert switch.decide(_state([0.8], [0.1])).objective == "ttft"
    # one iteration of p^TPOT = 0.9 > 0.8: the window's means are (0.8·3)/3 = 0.8 vs (0.1+0.1+0.9)/3 ≈ 0.367
    problem = switch.decide(_state([0.8], [0.9]))
    assert problem.objective == "ttft"
    assert problem.p_tpot == pytest.approx(0.3666667)
    # two more: the window holds 0.1 0.9 0.9 → 0.633 and then 0.9 0.9 0.9 → 0.9 > 0.8
    assert switch.decide(_state([0.8], [0.9])).objective == "ttft"
    assert switch.decide(_state([0.8], [0.9])).objective == "tpot"


def test_decisions_count_tpot_iterations_switches_and_loosening() -> None:
    switch = ProblemSwitch(window=1)
    switch.decide(_state([0.2], [0.9]))  # TPOT: a switch from the start
    switch.decide(_state([0.2], [0.9]))  # TPOT again: no new switch
    switch.decide(_state([0.9], [0.2]))  # back to TTFT
    switch.decide(_state([2.0], [1.5, 0.5]))  # both missed: TTFT, TPOT loosened to a = 1/2
    switch.decide(_state([0.2], [0.9]))  # TPOT: the second switch
    assert switch.decisions.snapshot() == {"tpot_iterations": 3, "switched_to_tpot": 2, "loosened": 1}
