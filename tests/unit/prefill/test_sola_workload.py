"""SOLA §4.4.3's constrained workload, k_i (eq. 1) and n_i (eq. 2), by hand (prefill_worker/chunking/sola.py).

The cost model throughout: Cᵖ = 1 ms per prompt token (0.001 · Σ l_in), Cᵈ = 10 ms per decode iteration.
"""

from __future__ import annotations

from tests.prefill_support import req, state
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.common.sola_state import Observed, RequestState, SystemState
from tetriserve.common.sola_strategy import Problem
from tetriserve.prefill_worker.chunking import make_chunking_policy
from tetriserve.prefill_worker.chunking.sola import SolaWorkload
from tetriserve.prefill_worker.views import Chunk, PrefillState


def _cost(tile: int | None = None) -> CostEstimator:
    return CostEstimator(PrefillCost(0.0, 0.0, 1e-3, 0.0), DecodeCost(0.0, 0.0, 0.01), 512, 0.5, tile_tokens=tile)


def _decode(rid: str, t_tpot: float, l_out: int, slo: float) -> RequestState:
    return RequestState(rid, t_ttft=0.1, t_tpot=t_tpot, l_out=l_out, l_left=10, l_in=50, tpot_slo_s=slo)


def _chunks(chunks: list[Chunk]) -> list[tuple[str, int]]:
    return [(c.request_id, c.tokens) for c in chunks]


def test_eq1_k_is_the_largest_tile_multiple_that_keeps_tpot() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    s = state([req("a", 1000)], max_budget=1024)
    # 0.05 + Cᵖ/10 ≤ 0.1  →  Cᵖ ≤ 0.5 s  →  ≤ 500 tokens  →  the largest multiple of 128 is 384
    sys = SystemState.of(0.0, [_decode("d1", 0.05, 10, 0.1)])
    assert policy.k_ttft(s, sys, Problem("ttft")) == 384
    # a second decode: 0.09 + Cᵖ/20 ≤ 0.1  →  Cᵖ ≤ 0.2 s  →  ≤ 200 tokens  →  128
    sys = SystemState.of(0.0, [_decode("d1", 0.05, 10, 0.1), _decode("d2", 0.09, 20, 0.1)])
    assert policy.k_ttft(s, sys, Problem("ttft")) == 128
    assert policy.decisions.snapshot() == {"k_capped": 2}


def test_eq1_at_an_a_percent_level_the_worst_decode_may_break_it() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    s = state([req("a", 1000)], max_budget=1024)
    sys = SystemState.of(0.0, [_decode("d1", 0.05, 10, 0.1), _decode("d2", 0.09, 20, 0.1)])
    # a = 0.5: the 1st smallest of the two terms. k = 512: d1 (0.05 + 0.512/10)/0.1 = 1.012 and
    # d2 (0.09 + 0.512/20)/0.1 = 1.156, both over; k = 384: d1 0.884, d2 1.092, the smaller within
    assert policy.k_ttft(s, sys, Problem("ttft", level=0.5)) == 384


def test_eq1_with_no_tile_within_the_tpot_slo_only_decodes() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    # 0.099 + Cᵖ/10 ≤ 0.1  →  ≤ 10 tokens: not one tile
    sys = SystemState.of(0.0, [_decode("d1", 0.099, 10, 0.1)])
    assert policy.k_ttft(state([req("a", 1000)], max_budget=1024), sys, Problem("ttft")) == 0


def test_eq1_without_decodes_is_the_tile_quantised_ceiling() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    assert policy.k_ttft(state([req("a", 2000)], max_budget=1000), SystemState.of(0.0, []), Problem("ttft")) == 896
    # 1000 // 128 = 7 tiles, 7 · 128 = 896; below one tile the ceiling itself
    assert policy.top(100) == 100
    assert policy.decisions.snapshot() == {}


def _tpot_state() -> tuple[PrefillState, SystemState]:
    ordered = [
        req("a", 200, ttft_slo_s=1.0),  # Cᵖ(a) = 0.2 s
        req("b", 300, ttft_slo_s=0.6),  # Cᵖ(b) = 0.3 s
        req("c", 100, ttft_slo_s=2.0),  # Cᵖ(c) = 0.1 s
    ]
    sys = SystemState.of(
        0.0,
        [
            RequestState("a", 0.1, 0.0, 0, 16, 200, ttft_slo_s=1.0),
            RequestState("b", 0.35, 0.0, 0, 16, 300, ttft_slo_s=0.6),
            RequestState("c", 0.0, 0.0, 0, 16, 100, ttft_slo_s=2.0),
            RequestState("d", 0.1, 0.05, 5, 10, 50, tpot_slo_s=0.1),  # one decoding: Cᵈ = 0.01 s
        ],
    )
    return state(ordered, max_budget=1024), sys


def test_eq2_n_is_the_fewest_prompts_that_keep_the_waiting_ones_ttft() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    s, sys = _tpot_state()
    # n = 0: b (0.35 + 0 + 0.01 + 0.3)/0.6 = 1.1 > 1
    # n = 1 (a runs, Cᵖ = 0.2): b (0.35 + 0.2 + 0.01 + 0.3)/0.6 = 1.433 > 1
    # n = 2 (a, b run, Cᵖ = 0.5): c (0.0 + 0.5 + 0.01 + 0.1)/2.0 = 0.305 ≤ 1
    assert policy.n_tpot(s, sys, Problem("tpot")) == 2
    assert policy.decisions.snapshot() == {"n_limited": 1}  # c held back, the ceiling had room for it


def test_eq2_loosened_to_a_percent() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    s, sys = _tpot_state()
    # a = 1/3 at n = 0: terms a (0.1 + 0.01 + 0.2)/1.0 = 0.31, b 1.1, c (0.01 + 0.1)/2 = 0.055;
    # ⌈(1/3)·3⌉ = the 1st smallest, 0.055 ≤ 1
    assert policy.n_tpot(s, sys, Problem("tpot", level=1 / 3)) == 0


def test_eq2_with_nothing_decoding_runs_at_least_one_prompt() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    s = state([req("a", 200, ttft_slo_s=10.0)], max_budget=1024)
    sys = SystemState.of(0.0, [RequestState("a", 0.0, 0.0, 0, 16, 200, ttft_slo_s=10.0)])
    assert policy.n_tpot(s, sys, Problem("tpot")) == 1  # (0 + 0 + 0 + 0.2)/10 holds at n = 0, but nothing runs


def test_plan_on_a_prefill_engine_optimises_ttft_in_tile_multiples() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128)
    chunks = policy.plan(state([req("a", 1000, ttft_slo_s=5.0)], max_budget=1000, now=1.0))
    assert _chunks(chunks) == [("a", 896)]  # 7 · 128
    assert policy.token_budget(state([], max_budget=1000)) == 896
    assert policy.decisions.snapshot() == {}


def test_plan_switches_to_tpot_when_the_decodes_are_less_fulfilled() -> None:
    policy = SolaWorkload(_cost(), tile_tokens=128, window_iters=1)
    prompt = req("a", 300, arrival=0.5, ttft_slo_s=10.0)

    def at(now: float, generated: int) -> PrefillState:
        d = Observed("d", 0.0, 50, 100, generated=generated, tpot_slo_s=1.0)
        return state([prompt], max_budget=1024, now=now, decoding=(d,))

    # at 0.0 the decode has its first token, no TPOT yet: optimise TTFT, eq. 1 binds nothing, k = 1024
    assert _chunks(policy.plan(at(0.0, 1))) == [("a", 300)]
    # at 1.0 with 3 tokens: t^TPOT = (1.0 − 0.0)/(3 − 1) = 0.5, p^TPOT = 0.5; p^TTFT = (1.0 − 0.5)/10 = 0.05:
    # optimise TPOT. n = 0: a (0.5 + 0 + 0.01 + 0.3)/10 = 0.081 ≤ 1, and a decode runs: no prompt this time
    assert policy.plan(at(1.0, 3)) == []
    assert policy.decisions.snapshot() == {"tpot_iterations": 1, "switched_to_tpot": 1, "n_limited": 1}


def test_registry_builds_sola_with_the_profiles_tile_else_128() -> None:
    measured = make_chunking_policy("sola", 512, _cost(tile=64))
    assert isinstance(measured, SolaWorkload) and measured.tile_tokens == 64
    fallback = make_chunking_policy("sola", 512, _cost())
    assert isinstance(fallback, SolaWorkload) and fallback.tile_tokens == 128  # SOLA's A100 tile
    configured = make_chunking_policy("sola", 512, _cost(tile=64), sola_tile_tokens=32)
    assert isinstance(configured, SolaWorkload) and configured.tile_tokens == 32
