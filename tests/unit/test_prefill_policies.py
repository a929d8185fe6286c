"""Tests for the prefill-side policies: queue order, decode dispatch and request views.

Views and loads come from small factories. The SchedBatch gate has its own file
(``test_sched_batch_gate.py``).
"""

from __future__ import annotations

import random

import pytest

from tetriserve.common.length import LengthEstimate
from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.dispatch import DISPATCH_POLICIES, make_dispatch_policy
from tetriserve.prefill_worker.dispatch.base import DispatchParams, account
from tetriserve.prefill_worker.dispatch.power_of_two import PowerOfTwo
from tetriserve.prefill_worker.dispatch.simple import RandomChoice, RoundRobin
from tetriserve.prefill_worker.views import ReqView

BS = 16


def view(
    rid: str = "r",
    prompt_len: int = 100,
    max_tokens: int = 100,
    arrival: float = 0.0,
    estimate: LengthEstimate | None = None,
) -> ReqView:
    return ReqView(rid, prompt_len, max_tokens, arrival, estimate)


def est(lower: int, estimate: int, upper: int) -> LengthEstimate:
    return LengthEstimate(lower, estimate, upper)


def load(
    wid: str,
    free: int = 1000,
    heavy: int = 0,
    light: int = 0,
    accepting: bool = True,
    total: int = 1000,
    remaining: int = 0,
) -> DecodeLoad:
    return DecodeLoad(wid, free, total, BS, heavy + light, 0, heavy, light, 0.0, accepting, remaining)


LIGHT = view("light", prompt_len=100, max_tokens=100, estimate=est(5, 10, 20))  # 120 tokens -> 8 blocks
HEAVY = view("heavy", prompt_len=100, max_tokens=1000, estimate=est(200, 300, 400))  # 500 tokens -> 32 blocks
PARAMS = DispatchParams(heavy_threshold_tokens=128)
SEEDS = range(40)


# -- views -----------------------------------------------------------------------------------------------------


def test_kv_upper_without_estimate_uses_max_tokens() -> None:
    v = view(prompt_len=100, max_tokens=50)
    assert v.kv_tokens_upper() == 150
    assert v.kv_blocks_upper(16) == 10  # ceil(150 / 16)
    assert v.kv_blocks_upper(150) == 1
    assert v.kv_blocks_upper(1) == 150


def test_kv_upper_with_estimate_uses_its_upper() -> None:
    v = view(prompt_len=100, max_tokens=500, estimate=est(0, 10, 20))
    assert v.kv_tokens_upper() == 120
    assert v.kv_blocks_upper(16) == 8


def test_kv_upper_is_capped_by_max_tokens() -> None:
    v = view(prompt_len=100, max_tokens=50, estimate=est(0, 40, 80))
    assert v.kv_tokens_upper() == 150
    assert v.kv_blocks_upper(16) == 10


def test_kv_blocks_exact_multiple() -> None:
    assert view(prompt_len=16, max_tokens=16).kv_blocks_upper(16) == 2


def test_is_heavy_with_and_without_estimate() -> None:
    assert view(max_tokens=200).is_heavy(128)  # no estimate: assume it runs to max_tokens
    assert not view(max_tokens=100).is_heavy(128)
    assert not view(max_tokens=1000, estimate=est(0, 127, 500)).is_heavy(128)
    assert view(max_tokens=1000, estimate=est(0, 128, 500)).is_heavy(128)


# -- dispatch: power of two ---------------------------------------------------------------------------------------


def p2c_picks(req: ReqView, loads: list[DecodeLoad], seeds: range = SEEDS) -> set[str | None]:
    policy = PowerOfTwo(PARAMS)
    return {policy.choose(req, loads, random.Random(seed)) for seed in seeds}


def test_p2c_considers_only_workers_with_enough_free_kv() -> None:
    # only "fits" has room for HEAVY's 32 blocks; it wins although its heavy:light ratio is the worst
    loads = [load("a", free=10), load("b", free=31), load("fits", free=32, heavy=9), load("c", free=0)]
    assert p2c_picks(HEAVY, loads) == {"fits"}


def test_p2c_samples_among_fitting_workers_only() -> None:
    loads = [load("a", free=100), load("b", free=100), load("tiny1", free=1), load("tiny2", free=2)]
    assert p2c_picks(LIGHT, loads) == {"a", "b"}


def test_p2c_falls_back_to_all_accepting_when_none_fits() -> None:
    loads = [load("a", free=1, heavy=0), load("b", free=2, heavy=3), load("off", free=500, accepting=False)]
    # neither fits: the one with more free KV, whatever the ratio (the ratio alone herds a burst)
    assert p2c_picks(HEAVY, loads) == {"b"}
    overcommitted = [load("a", free=-40, light=20), load("b", free=-8, heavy=5)]  # local copies after a burst
    assert p2c_picks(LIGHT, overcommitted) == {"b"}
    assert p2c_picks(HEAVY, [load("a", free=-8, heavy=3), load("b", free=-8, heavy=0)]) == {"b"}  # tie: ratio


def test_p2c_returns_none_when_nobody_accepts() -> None:
    policy = PowerOfTwo(PARAMS)
    assert policy.choose(LIGHT, [], random.Random(0)) is None
    assert policy.choose(LIGHT, [load("a", accepting=False), load("b", accepting=False)], random.Random(0)) is None


def test_p2c_single_candidate() -> None:
    loads = [load("only", free=1, heavy=50), load("off", accepting=False)]
    assert p2c_picks(HEAVY, loads) == {"only"}


def test_p2c_ratio_is_computed_after_adding_the_request() -> None:
    # before adding anything, "idle" (0/1) beats "busy" (1/6); with a heavy request added
    # "idle" becomes 1/1 and "busy" 2/6, so the heavy request goes to "busy"
    loads = [load("idle", heavy=0, light=0), load("busy", heavy=1, light=5)]
    assert p2c_picks(HEAVY, loads) == {"busy"}
    # a light request adds to the denominator instead: idle 0/2 < busy 1/7
    assert p2c_picks(LIGHT, loads) == {"idle"}


def test_p2c_spreads_heavy_decodes() -> None:
    loads = [load("a", heavy=4, light=4), load("b", heavy=1, light=4)]
    assert p2c_picks(HEAVY, loads) == {"b"}
    assert p2c_picks(LIGHT, loads) == {"b"}


@pytest.mark.parametrize(("free_a", "free_b", "winner"), [(50, 80, "b"), (80, 50, "a")])
def test_p2c_tie_goes_to_more_free_kv(free_a: int, free_b: int, winner: str) -> None:
    loads = [load("a", free=free_a, heavy=1, light=2), load("b", free=free_b, heavy=1, light=2)]
    assert p2c_picks(LIGHT, loads) == {winner}


def test_p2c_without_estimate_uses_max_tokens() -> None:
    req = view("r", prompt_len=100, max_tokens=412)  # 512 tokens -> 32 blocks, heavy by max_tokens
    loads = [load("small", free=31), load("big", free=32, heavy=3)]
    assert p2c_picks(req, loads) == {"big"}


def test_p2c_is_deterministic_with_a_seeded_rng_and_samples_pairs() -> None:
    loads = [load(f"w{i}", free=100 + i, heavy=i % 3, light=i % 2) for i in range(8)]
    policy = PowerOfTwo(PARAMS)
    reqs = [LIGHT, HEAVY] * 25

    def run(seed: int) -> list[str | None]:
        rng = random.Random(seed)
        return [policy.choose(r, loads, rng) for r in reqs]

    assert run(7) == run(7)
    assert run(7) != run(8)
    # the input order of the loads does not matter (candidates are sorted by worker id)
    shuffled = list(loads)
    random.Random(1).shuffle(shuffled)
    assert [policy.choose(r, shuffled, random.Random(3)) for r in reqs[:10]] == [
        policy.choose(r, loads, random.Random(3)) for r in reqs[:10]
    ]
    # with 8 candidates and random pairs, several workers get picked, never the worst-ratio one alone
    assert len(set(run(7))) > 1


def test_p2c_never_picks_the_worse_of_its_two_samples() -> None:
    class Recorder(random.Random):
        def sample(self, population, k, *, counts=None):  # type: ignore[no-untyped-def, override]
            picked = super().sample(population, k)
            self.pair = picked
            return picked

    loads = [load(f"w{i}", free=100, heavy=i, light=(7 * i) % 5) for i in range(6)]
    policy = PowerOfTwo(PARAMS)
    for seed in SEEDS:
        rng = Recorder(seed)
        chosen = policy.choose(HEAVY if seed % 2 else LIGHT, loads, rng)
        heavy = (seed % 2) == 1
        ratios = {ld.worker_id: (ld.heavy + heavy) / (ld.light + (not heavy) + 1) for ld in rng.pair}
        assert chosen in ratios and ratios[chosen] == min(ratios.values())


# -- dispatch: random and round-robin ------------------------------------------------------------------------------


def test_random_choice_only_accepting_and_seeded() -> None:
    loads = [load("a"), load("b", accepting=False), load("c"), load("d")]
    policy = RandomChoice(PARAMS)
    picks = [policy.choose(LIGHT, loads, random.Random(s)) for s in range(60)]
    assert set(picks) == {"a", "c", "d"}
    rng1, rng2 = random.Random(5), random.Random(5)
    assert [policy.choose(LIGHT, loads, rng1) for _ in range(20)] == [
        policy.choose(LIGHT, loads, rng2) for _ in range(20)
    ]
    assert policy.choose(LIGHT, [load("x", accepting=False)], random.Random(0)) is None
    assert policy.choose(LIGHT, [], random.Random(0)) is None


def test_random_choice_ignores_free_kv() -> None:
    loads = [load("full", free=0), load("empty", free=1000)]
    picks = {RandomChoice(PARAMS).choose(HEAVY, loads, random.Random(s)) for s in range(40)}
    assert picks == {"full", "empty"}


def test_round_robin_cycles_over_accepting_workers_by_id() -> None:
    policy = RoundRobin(PARAMS)
    loads = [load("c"), load("a"), load("off", accepting=False), load("b")]
    rng = random.Random(0)
    assert [policy.choose(LIGHT, loads, rng) for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_none_when_nobody_accepts_and_then_resumes() -> None:
    policy = RoundRobin(PARAMS)
    rng = random.Random(0)
    loads = [load("a"), load("b")]
    assert policy.choose(LIGHT, loads, rng) == "a"
    assert policy.choose(LIGHT, [load("a", accepting=False)], rng) is None
    assert policy.choose(LIGHT, loads, rng) == "b"  # a refusal does not advance the cycle


def test_dispatch_registry() -> None:
    assert set(DISPATCH_POLICIES) == {"power-of-two", "random", "round-robin", "least-loaded", "imbalance", "max-min"}
    assert isinstance(make_dispatch_policy("power-of-two", PARAMS), PowerOfTwo)
    assert isinstance(make_dispatch_policy("random", PARAMS), RandomChoice)
    assert isinstance(make_dispatch_policy("round-robin", PARAMS), RoundRobin)
    with pytest.raises(ValueError, match=r"prefill\.dispatch_policy: unknown policy 'fastest'") as err:
        make_dispatch_policy("fastest", PARAMS)
    for name in DISPATCH_POLICIES:
        assert name in str(err.value)


# -- dispatch: load-based variants --------------------------------------------------------------------------------


def test_least_loaded_takes_fewest_requests_ties_by_free_kv() -> None:
    policy = make_dispatch_policy("least-loaded", PARAMS)
    loads = [load("d0", free=10, light=3), load("d1", free=5, light=1), load("d2", free=50, heavy=1)]
    assert policy.choose(LIGHT, loads, random.Random(0)) == "d2"
    assert policy.choose(LIGHT, [load("d0", accepting=False)], random.Random(0)) is None


def test_imbalance_sends_heavy_decodes_to_the_same_workers() -> None:
    policy = make_dispatch_policy("imbalance", PARAMS)
    loads = [load(f"d{i}") for i in range(4)]
    assert {policy.choose(HEAVY, loads, random.Random(s)) for s in SEEDS} == {"d0", "d1"}
    assert {policy.choose(LIGHT, loads, random.Random(s)) for s in SEEDS} == {"d2", "d3"}
    assert policy.choose(LIGHT, [load("d0")], random.Random(0)) == "d0"  # one worker takes both kinds


def test_max_min_takes_the_least_predicted_remaining_work() -> None:
    policy = make_dispatch_policy("max-min", PARAMS)
    loads = [load("d0", remaining=900), load("d1", remaining=100), load("d2", remaining=400)]
    assert policy.choose(LIGHT, loads, random.Random(0)) == "d1"
    assert policy.choose(LIGHT, [load("d0", accepting=False)], random.Random(0)) is None


def test_account_debits_the_local_copy_until_the_next_broadcast() -> None:
    before = load("a", free=40, heavy=1, light=1)
    after = account(before, HEAVY, PARAMS.heavy_threshold_tokens)
    assert (after.free_kv_blocks, after.queued, after.heavy, after.light) == (8, before.queued + 1, 2, 1)
    assert after.remaining_tokens == before.remaining_tokens + 300  # the point estimate
    after = account(after, HEAVY, PARAMS.heavy_threshold_tokens)
    assert after.free_kv_blocks == -24  # overcommitted: kept, so "least overcommitted" can still be told
    assert account(after, LIGHT, PARAMS.heavy_threshold_tokens).light == 2
