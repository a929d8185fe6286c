"""Decode admission (TetriInfer §3.4): greedy, reserve-static, reserve-dynamic on hand-built states."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import ADMISSION_NAMES, make_admission_policy
from tetriserve.decode_worker.admission.greedy import Greedy
from tetriserve.decode_worker.admission.peak import peak_fits, peak_fits_by_sum
from tetriserve.decode_worker.admission.reserve_dynamic import ReserveDynamic
from tetriserve.decode_worker.admission.reserve_static import ReserveStatic
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

BS = 16


def req(
    rid: str, prompt: int, lower: int, upper: int | None = None, generated: int = 0, held: int = 0
) -> DecodeReqView:
    est = LengthEstimate(lower, lower, upper if upper is not None else lower + 100, 0, 0.9, "test")
    return DecodeReqView(rid, prompt, 1000, generated=generated, estimate=est, held_blocks=held)


def run(rid: str, prompt: int, lower: int, generated: int = 0) -> DecodeReqView:
    """A member of the running batch: it holds the blocks of its context."""
    return replace(req(rid, prompt, lower, generated=generated), held_blocks=blocks_for(prompt + generated, BS))


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


def test_reserve_dynamic_literal_rule_checks_kv_when_the_shortest_job_finishes() -> None:
    # batch: r1 has 20 tokens left, r2 100; k = 20. r1: 48 → 68 tokens (3 → 5 blocks); r2: 64 → 84 (4 → 6)
    literal = ReserveDynamic(horizons="shortest")
    running = (run("r1", 48, lower=20), run("r2", 64, lower=100))
    state = DecodeState(free_blocks=8, block_size=BS, running=running)
    assert literal.horizon(state) == 20
    # capacity 8 + 3 + 4 = 15; at k=20: 5 + 6 + new; a 40-token prompt → 60 tokens = 4 blocks: 15 ≤ 15
    assert literal.admit(req("n", 40, lower=200), state)
    assert not literal.admit(req("m", 49, lower=200), state)  # 69 tokens = 5 blocks: 16 > 15
    # checking every finish: at k=100 (r2's end) r2 holds 11 blocks and n 9: 20 > 15
    assert not ReserveDynamic().admit(req("n", 40, lower=200), state)
    # n ending at k=40: k=20 → 5 + 6 + 4 = 15; k=40 (r1 gone) → 7 + 5; k=100 (n gone) → 11: all ≤ 15
    assert ReserveDynamic().admit(req("n", 40, lower=40), state)


def test_reserve_dynamic_when_the_shortest_job_finishes_this_very_step() -> None:
    running = (run("done", 48, lower=10, generated=10), run("long", 64, lower=500))
    state = DecodeState(free_blocks=2, block_size=BS, running=running)
    literal = ReserveDynamic(horizons="shortest")
    assert literal.horizon(state) == 0  # nothing grows before it frees its blocks
    assert literal.admit(req("n", 32, lower=300), state)  # needs its 2 prompt blocks only
    assert not literal.admit(req("n", 33, lower=300), state)
    # every horizon: the long job alone outgrows the 10-block cache by k=500 (36 blocks), so nothing more
    # joins it until it is done: whatever joined would be preempted or cause a preemption
    assert not ReserveDynamic().admit(req("n", 16, lower=0), state)


def test_reserve_dynamic_with_an_empty_batch_admits_what_fits_now() -> None:
    state = DecodeState(free_blocks=3, block_size=BS)
    for policy in (ReserveDynamic(), ReserveDynamic(horizons="shortest")):
        assert policy.admit(req("n", 48, lower=1000), state)  # larger than the cache in the end: runs alone
        assert not policy.admit(req("n", 49, lower=1000), state)
    with pytest.raises(ValueError, match=r"decode\.admission\.horizons: unknown"):
        ReserveDynamic(horizons="some")  # type: ignore[arg-type]


@pytest.mark.parametrize("shift", [-100, 100], ids=["one-bucket-low", "one-bucket-high"])
def test_every_prediction_one_bucket_off(shift: int) -> None:
    """With every prediction one 100-token bucket off, decisions follow the prediction, not the truth:
    low predictions admit more (risking preemption later), high ones admit fewer (idle KV)."""
    truth = {"r1": 150, "r2": 250}
    running = tuple(run(rid, 64, lower=max(0, n + shift)) for rid, n in truth.items())
    state = DecodeState(free_blocks=25, block_size=BS, running=running)  # capacity 25 + 4 + 4 = 33 blocks
    new = req("n", 64, lower=max(0, 200 + shift))
    # low (rem 50/150/100): peak at k=50 → 8 + 8 + 8 = 24 ≤ 33; high (250/350/300): at k=250 → 20 + 20 + 20 > 33
    assert ReserveDynamic().admit(new, state) is (shift < 0)
    # static reserves whole predictions: low 8 + 14 + 11 = 33 ≤ 33; high 20 + 26 + 23 > 33
    assert ReserveStatic().admit(new, state) is (shift < 0)


def test_peak_fits_by_hand() -> None:
    a, b = run("a", 30, lower=40), run("b", 10, lower=5)  # contexts 30 and 10; 40 and 5 tokens to go
    remaining = DecodeReqView.predicted_remaining
    # k=0: 2 + 1 = 3; k=5: 3 + 1 = 4; k=40: 5 (b done)
    assert peak_fits((a, b), remaining, capacity=5, block_size=BS)
    assert not peak_fits((a, b), remaining, capacity=4, block_size=BS)
    assert peak_fits((a, b), remaining, capacity=4, block_size=BS, horizons=[0, 5])
    assert peak_fits((a, b), remaining, capacity=3, block_size=BS, horizons=[0])
    assert not peak_fits((a, b), remaining, capacity=3, block_size=BS, horizons=[0], pad=3)  # 3 + 1 > 3
    assert peak_fits((), remaining, capacity=0, block_size=BS) and not peak_fits((), remaining, -1, BS)
    assert peak_fits((a, b), remaining, capacity=0, block_size=BS, horizons=[])  # no horizon to check


def test_peak_fits_matches_its_definition() -> None:
    rng = random.Random(7)
    remaining = DecodeReqView.predicted_remaining
    for _ in range(500):
        members = tuple(
            run(f"r{i}", rng.randint(1, 300), lower=rng.randint(0, 400), generated=rng.randint(0, 50))
            for i in range(rng.randint(0, 8))
        )
        capacity, pad = rng.randint(-2, 120), rng.choice([0, 0, 8, 31])
        horizons = None if rng.random() < 0.6 else {rng.randint(0, 500) for _ in range(rng.randint(0, 4))}
        expected = peak_fits_by_sum(members, remaining, capacity, BS, horizons, pad)
        assert peak_fits(members, remaining, capacity, BS, horizons, pad) is expected


def test_admitting_folds_into_the_state_for_the_next_decision() -> None:
    state = DecodeState(free_blocks=6, block_size=BS)
    a = req("a", 48, lower=16)
    assert ReserveStatic().admit(a, state)
    after = state.with_admitted(a)
    assert after.free_blocks == 3 and after.running == (replace(a, held_blocks=3),)  # it now holds its prompt's
    assert after.capacity == state.capacity == 6  # blocks move from the pool to the batch; the total stays
    assert not ReserveStatic().admit(req("b", 48, lower=16), after)


def test_registry() -> None:
    for name in ADMISSION_NAMES:
        assert make_admission_policy(name).name == name
    with pytest.raises(ValueError, match=r"decode\.admission.policy: unknown policy 'lifo'"):
        make_admission_policy("lifo")
