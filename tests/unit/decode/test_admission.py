"""Decode admission (TetriInfer §3.4): greedy, reserve-static, reserve-dynamic on hand-built states."""

from __future__ import annotations

import pytest

from common.length import LengthEstimate
from decode_worker.admission import ADMISSION_NAMES, make_admission_policy
from decode_worker.admission.greedy import Greedy
from decode_worker.admission.reserve_dynamic import ReserveDynamic
from decode_worker.admission.reserve_static import ReserveStatic
from decode_worker.views import DecodeReqView, DecodeState

BS = 16


def req(
    rid: str, prompt: int, lower: int, upper: int | None = None, generated: int = 0, held: int = 0
) -> DecodeReqView:
    est = LengthEstimate(lower, lower, upper if upper is not None else lower + 100, 0, 0.9, "test")
    return DecodeReqView(rid, prompt, 1000, generated=generated, estimate=est, held_blocks=held)


def test_views_count_context_remaining_and_blocks() -> None:
    r = req("a", 30, lower=40, generated=10)
    assert r.context == 40 and r.predicted_remaining() == 30 and r.predicted_remaining("upper") == 130
    assert r.blocks_at(0, BS) == 3 and r.blocks_at(8, BS) == 3 and r.blocks_at(9, BS) == 4
    assert r.blocks_at(10_000, BS) == 5  # stops growing at its predicted end: 70 tokens
    no_estimate = DecodeReqView("x", 10, max_tokens=50)
    assert no_estimate.predicted_remaining() == 50  # without a prediction, all it may generate


def test_greedy_admits_whatever_fits_now() -> None:
    state = DecodeState(free_blocks=2, block_size=BS)
    assert Greedy().admit(req("a", 32, lower=500), state)  # 2 blocks now; its future is not looked at
    assert not Greedy().admit(req("b", 33, lower=1), state)


def test_reserve_static_counts_the_predicted_output() -> None:
    state = DecodeState(free_blocks=4, block_size=BS)
    assert ReserveStatic().admit(req("a", 32, lower=32), state)  # 64 tokens = 4 blocks
    assert not ReserveStatic().admit(req("b", 32, lower=33), state)  # 65 tokens = 5 blocks
    # its prompt's KV has landed already: only what it still needs counts
    assert ReserveStatic().admit(req("c", 32, lower=48, held=2), state)


def test_no_worker_room_refuses_everything_but_greedy_of_a_fitting_context() -> None:
    full = DecodeState(free_blocks=0, block_size=BS, running=(req("r", 64, lower=10),))
    for name in ADMISSION_NAMES:
        assert not make_admission_policy(name).admit(req("a", 16, lower=1), full)
    # a request that holds its prompt's blocks already and would not grow before the horizon
    assert Greedy().admit(req("b", 16, lower=0, held=1), full)


def test_reserve_dynamic_checks_kv_when_the_shortest_job_finishes() -> None:
    # batch: r1 has 20 tokens left, r2 100; k = 20. r1: 48 → 68 tokens (3 → 5 blocks); r2: 64 → 84 (4 → 6)
    running = (req("r1", 48, lower=20), req("r2", 64, lower=100))
    state = DecodeState(free_blocks=8, block_size=BS, running=running)
    assert ReserveDynamic().horizon(state) == 20
    # growth 4 blocks; new 40-token prompt at k=20 → 60 tokens = 4 blocks: 8 ≤ 8
    assert ReserveDynamic().admit(req("n", 40, lower=200), state)
    assert not ReserveDynamic().admit(req("m", 49, lower=200), state)  # 69 tokens = 5 blocks: 9 > 8
    # reserve-static would refuse the first one (its whole predicted output: 240 tokens = 15 blocks)
    assert not ReserveStatic().admit(req("n", 40, lower=200), state)


def test_reserve_dynamic_when_the_shortest_job_finishes_this_very_step() -> None:
    running = (req("done", 48, lower=10, generated=10), req("long", 64, lower=500))
    state = DecodeState(free_blocks=2, block_size=BS, running=running)
    assert ReserveDynamic().horizon(state) == 0  # nothing grows before it frees its blocks
    assert ReserveDynamic().admit(req("n", 32, lower=300), state)  # needs its 2 prompt blocks only
    assert not ReserveDynamic().admit(req("n", 33, lower=300), state)


def test_reserve_dynamic_with_an_empty_batch_admits_what_fits_now() -> None:
    state = DecodeState(free_blocks=3, block_size=BS)
    assert ReserveDynamic().admit(req("n", 48, lower=1000), state)
    assert not ReserveDynamic().admit(req("n", 49, lower=1000), state)


@pytest.mark.parametrize("shift", [-100, 100], ids=["one-bucket-low", "one-bucket-high"])
def test_every_prediction_one_bucket_off(shift: int) -> None:
    """With every prediction one 100-token bucket off, decisions follow the prediction, not the truth:
    low predictions admit more (risking preemption later), high ones admit fewer (idle KV)."""
    truth = {"r1": 150, "r2": 250}
    running = tuple(req(rid, 64, lower=max(0, n + shift)) for rid, n in truth.items())
    state = DecodeState(free_blocks=40, block_size=BS, running=running)
    new = req("n", 64, lower=max(0, 200 + shift))
    admitted = ReserveDynamic().admit(new, state)
    # k = 50 (low) or 250 (high): growth 4+4 blocks + new 8 → 16 ≤ 40 (low); 16+16 + 20 → 52 > 40 (high)
    assert admitted is (shift < 0)


def test_admitting_folds_into_the_state_for_the_next_decision() -> None:
    state = DecodeState(free_blocks=6, block_size=BS)
    a = req("a", 48, lower=16)
    assert ReserveStatic().admit(a, state)
    after = state.with_admitted(a)
    assert after.free_blocks == 3 and after.running == (a,)
    assert not ReserveStatic().admit(req("b", 48, lower=16), after)


def test_registry() -> None:
    for name in ADMISSION_NAMES:
        assert make_admission_policy(name).name == name
    with pytest.raises(ValueError, match=r"decode\.admission_policy: unknown policy 'lifo'"):
        make_admission_policy("lifo")
