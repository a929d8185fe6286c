"""CacheOpt admission (§3.3) and SOLA decode order and peak-memory admission (§4.4.2, §5.1), hand-built states."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.unit.decode.sim import simulate, view
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import ADMISSION_NAMES, make_admission_policy
from tetriserve.decode_worker.admission.cacheopt import CacheOptAdmission
from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.admission.reserve_dynamic import ReserveDynamic
from tetriserve.decode_worker.admission.sola import SolaDecode, predicted_tpot
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

BS = 16


def req(rid: str, prompt: int, est: int, generated: int = 0, held: int = 0, **kw: object) -> DecodeReqView:
    e = LengthEstimate(0, est, est + 100, 0, 0.9, "test")
    return DecodeReqView(rid, prompt, 1000, generated=generated, estimate=e, held_blocks=held, **kw)  # type: ignore[arg-type]


def running(rid: str, prompt: int, est: int, generated: int = 0, **kw: object) -> DecodeReqView:
    return req(rid, prompt, est, generated, held=blocks_for(prompt + generated, BS), **kw)


def test_cacheopt_keeps_the_global_reserve_out_of_what_it_grants() -> None:
    batch = (running("a", 32, est=32),)  # peaks at 4 blocks
    state = DecodeState(free_blocks=6, block_size=BS, running=batch)  # capacity 8
    newcomer = req("n", 32, est=32)  # also 4 blocks at its end
    assert CacheOptAdmission(reserve_blocks=0, buffer_tokens=0).admit(newcomer, state)  # 8 ≤ 8
    assert not CacheOptAdmission(reserve_blocks=1, buffer_tokens=0).admit(newcomer, state)  # 8 > 7


def test_cacheopt_buffer_pads_each_member() -> None:
    state = DecodeState(free_blocks=6, block_size=BS, running=(running("a", 32, est=32),))
    newcomer = req("n", 32, est=32)
    pol = CacheOptAdmission(reserve_blocks=0, buffer_tokens=1)
    assert not admits(newcomer, state, pol.remaining, pad=1)  # the peak check: 65 tokens = 5 blocks each, 10 > 8
    # §3.3.2's amortisation takes the excess out of the buffers: A' = 8 × 16 = 128 tokens, E = 65 + 65 − 128 = 2,
    # a cut of 1 each (equal RT and prompts) leaves 64 tokens each, what each is predicted to reach
    assert pol.grants(newcomer, state) == {"a": 64.0, "n": 64.0}
    assert pol.admit(newcomer, state)
    assert pol.decisions.snapshot() == {"amortised": 1}
    # b = 3 and a longer newcomer: M = a 32 + 32 + 3 = 67, n2 32 + 40 + 3 = 75, E = 142 − 128 = 14, cuts 7 each:
    # a's grant 60 < 64 runs out before its finish, and nothing running finishes before it to release KV
    wider = CacheOptAdmission(reserve_blocks=0, buffer_tokens=3)
    assert not wider.admit(req("n2", 32, est=40), state)


def test_cacheopt_reuses_kv_a_long_runner_grows_into_only_later() -> None:
    """The embedding method: a short request fits inside a long one's granted-but-unused KV."""
    long = running("long", 16, est=300)  # holds 1 block, is granted 20
    state = DecodeState(free_blocks=21, block_size=BS, running=(long,))  # capacity 22
    short = req("s", 16, est=16)  # 2 blocks, done in 16 steps, long one then holds 2
    assert CacheOptAdmission(reserve_blocks=0, buffer_tokens=0).admit(short, state)
    # a static reservation of both grants would not fit: 20 + 2 = 22 > 22 − 1 (one-block reserve)
    assert CacheOptAdmission(reserve_blocks=1, buffer_tokens=0).admit(short, state)


def test_cacheopt_proactively_grants_m_more_iterations_to_a_request_that_outlived_its_estimate() -> None:
    pol = CacheOptAdmission(reserve_blocks=0, proactive_iters=32, buffer_tokens=0)  # 32 iterations, 1 token each
    outlived = running("o", 32, est=10, generated=16)  # 48 tokens, 3 blocks, estimate used up
    assert pol.remaining(outlived) == 32
    assert pol.remaining(replace(outlived, max_tokens=20)) == 4  # never past max_tokens
    state = DecodeState(free_blocks=3, block_size=BS, running=(outlived,))  # capacity 6
    # the outlived one is granted 48 + 32 = 80 tokens (5 blocks); 16 steps on it holds 4 blocks
    assert pol.admit(req("n", 8, est=16), state)  # at k=16: 4 + 2 = 6 ≤ 6
    assert not pol.admit(req("n2", 32, est=16), state)  # at k=16: 4 + 3 > 6
    # without the proactive grant the outlived request would look finished and leave room for it
    assert CacheOptAdmission(reserve_blocks=0, proactive_iters=0, buffer_tokens=0).admit(req("n2", 32, est=16), state)


def test_cacheopt_with_an_empty_batch_admits_what_fits_now() -> None:
    state = DecodeState(free_blocks=4, block_size=BS)
    assert CacheOptAdmission(reserve_blocks=10).admit(req("big", 64, est=1000), state)
    assert not CacheOptAdmission().admit(req("bigger", 65, est=0), state)


def test_cacheopt_rejects_negative_parameters() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        CacheOptAdmission(reserve_blocks=-1)
    with pytest.raises(ValueError, match=r"admission policy 'cacheopt'.*unexpected keyword"):
        make_admission_policy("cacheopt", reserve=1)


def test_sola_orders_by_descending_predicted_tpot() -> None:
    state = DecodeState(free_blocks=100, block_size=BS, now=10.0, step_s=0.01)
    waited = req("waited", 16, est=10, arrival_time=9.0)  # (1.0 + 0.1) / 10 = 0.11 s per token
    fresh_short = req("fresh", 16, est=10, arrival_time=10.0)  # 0.01
    long_waited = req("long", 16, est=1000, arrival_time=9.0)  # (1 + 10) / 1000 = 0.011
    preempted = req("pre", 16, est=100, generated=50, arrival_time=5.0)  # (5 + 0.5) / 100 = 0.055
    assert predicted_tpot(waited, state) == pytest.approx(0.11)
    assert predicted_tpot(preempted, state) == pytest.approx(0.055)
    policy = SolaDecode()
    order = policy.order([fresh_short, long_waited, preempted, waited], state)
    assert [r.request_id for r in order] == ["waited", "pre", "long", "fresh"]
    assert policy.decisions.snapshot() == {"reordered": 1}  # arrival order: pre (5.0) before waited (9.0)


def test_sola_reads_eq4_over_the_running_batch_corrected_by_eq5() -> None:
    # eq. 4: Cᵈ₀ = a₁·B + b₁·Σ l_has + c₁ = 0.001·2 + 0 + 0.002 = 0.004 s for the two running requests;
    # the measured step 0.008 s, α = 0.5: γ = 0.5·0.008/0.004 + 0.5·1.0 = 1.5, Cᵈ = 1.5·0.004 = 0.006 s
    cost = CostEstimator(PrefillCost(0.0, 0.0, 1e-3, 0.0), DecodeCost(1e-3, 0.0, 2e-3), 512, 0.5, alpha=0.5)
    policy = SolaDecode(cost)
    state = DecodeState(100, BS, (running("r1", 16, est=10), running("r2", 16, est=10)), now=10.0, step_s=0.008)
    assert policy.decode_step_s(state) == pytest.approx(0.006)
    # the next step with the same measurement: γ = 0.5·2.0 + 0.5·1.5 = 1.75, Cᵈ = 0.007
    assert policy.decode_step_s(state) == pytest.approx(0.007)
    # a waiting request of 10 tokens that waited 1 s: (1.0 + Cᵈ·10)/10 with the next γ = 1.875: Cᵈ = 0.0075
    waited, fresh = req("waited", 16, est=10, arrival_time=9.0), req("fresh", 16, est=10, arrival_time=9.5)
    assert [r.request_id for r in policy.order([fresh, waited], state)] == ["waited", "fresh"]
    assert policy.decisions.snapshot() == {}  # waited also arrived first: arrival order, nothing to count
    assert predicted_tpot(waited, state, 0.0075) == pytest.approx(0.1075)  # (1.0 + 0.075)/10


def test_sola_without_a_profile_reads_the_measured_step() -> None:
    state = DecodeState(100, BS, (running("r1", 16, est=10),), now=10.0, step_s=0.008)
    assert SolaDecode().decode_step_s(state) == 0.008


def test_sola_admission_is_the_peak_memory_check_on_the_point_estimate() -> None:
    batch = (running("a", 16, est=48),)  # 1 block now, 4 blocks at its end
    state = DecodeState(free_blocks=5, block_size=BS, running=batch)  # capacity 6
    assert SolaDecode().admit(req("n", 16, est=16), state)  # at k=16: 2 + 2 = 4; at k=48 only a: 4
    assert not SolaDecode().admit(req("n", 16, est=48), state)  # at k=48: 4 + 4 = 8 > 6


def test_shortest_job_finishing_this_very_step_frees_its_kv_for_every_peak_policy() -> None:
    done = running("done", 64, est=0)  # predicted to finish now: 4 blocks, none needed later
    grows = running("g", 16, est=16)  # 1 → 2 blocks
    state = DecodeState(free_blocks=1, block_size=BS, running=(done, grows))  # capacity 6
    newcomer = req("n", 32, est=16, held=2)  # landed KV: 2 blocks held; 3 blocks at its end
    # capacity with the newcomer's blocks: 8. At k=0: 4 + 1 + 2 = 7; at k=16 "done" is gone: 2 + 3 = 5
    exact = CacheOptAdmission(reserve_blocks=0, proactive_iters=0, buffer_tokens=0)
    for pol in (ReserveDynamic(end="estimate"), SolaDecode(), exact):
        assert pol.admit(newcomer, state), pol.name
    assert not ReserveDynamic(end="estimate").admit(replace(newcomer, held_blocks=0), state)  # 7 > 6
    # CacheOpt hedges: "done" may outlive its estimate, so it keeps a proactive grant of m = 2 iterations (CacheOpt
    # §5), 2 tokens: at k=2, blocks(66) + blocks(18) + blocks(34) = 5 + 2 + 3 = 10 > 8
    assert not CacheOptAdmission(reserve_blocks=0, buffer_tokens=0).admit(newcomer, state)


def burst(shift: int, seed: int = 0) -> list[DecodeReqView]:
    rng = random.Random(seed)
    out = []
    for i in range(24):
        truth = rng.choice([40, 120, 260])
        out.append(view(f"r{i}", rng.randrange(16, 64), truth, max(0, truth + shift), arrival=float(i)))
    return out


@pytest.mark.parametrize("name", ADMISSION_NAMES)
@pytest.mark.parametrize("shift", [-100, 0, 100], ids=["one-bucket-low", "exact", "one-bucket-high"])
def test_every_policy_finishes_every_request_whatever_the_prediction_error(name: str, shift: int) -> None:
    res = simulate(burst(shift), num_blocks=60, block_size=BS, admission=make_admission_policy(name))
    assert res.finished == 24
    # exact or generous predictions: reservations never run out; greedy and accelgen reserve nothing (accelgen
    # admits by vLLM's fit test, AccelGen §4.4 batching every TG task the KV holds)
    if shift >= 0 and name not in ("greedy", "accelgen"):
        assert res.preemptions == 0, (name, shift, res)


def test_greedy_preempts_where_reservations_do_not() -> None:
    greedy = simulate(burst(0), num_blocks=60, block_size=BS, admission=make_admission_policy("greedy"))
    assert greedy.preemptions > 0


def test_one_bucket_low_predictions_preempt_less_with_cacheopt_reserve_and_padding() -> None:
    """Under-prediction by a bucket: reserve-dynamic (lower end) preempts; CacheOpt's global reserve and
    proactive grants absorb part of the overrun."""
    low = burst(-100)
    dyn = simulate(low, num_blocks=60, block_size=BS, admission=ReserveDynamic(end="estimate"))
    opt = simulate(low, num_blocks=60, block_size=BS, admission=CacheOptAdmission(reserve_blocks=8, proactive_iters=16))
    assert dyn.preemptions > 0
    assert opt.preemptions < dyn.preemptions


# -- CacheOpt §3.3.2: request selection, critical requests, amortisation ------------------------------------------


def test_cacheopt_orders_waiting_requests_critical_first_then_by_tbt_slack() -> None:
    # now 10 s; T_I^max = 0.02 s; ε = one smoothed step = 0.01 s: critical when RT_tbt − 0.02 < 0.01
    state = DecodeState(free_blocks=100, block_size=BS, now=10.0, step_s=0.01, max_step_s=0.02)
    waiting = [
        req("a", 16, est=10, arrival_time=9.0, tbt_slo_s=0.5, waited_since=9.9),  # RT = 0.5 − 0.1 = 0.4
        req("b", 16, est=10, arrival_time=9.1),  # no SLO: last
        req("c", 16, est=10, arrival_time=9.2, tbt_slo_s=0.2, waited_since=9.95),  # RT = 0.2 − 0.05 = 0.15
        # preempted 0.3 s ago: RT = 0.1 − 0.3 = −0.2, critical; basic demand 16 + 8 = 24 tokens
        req("d", 16, est=10, arrival_time=9.3, tbt_slo_s=0.1, waited_since=9.7),
        req("e", 16, est=10, arrival_time=9.4, tbt_slo_s=0.05, waited_since=9.99),  # RT = 0.04: 0.02 ≥ 0.01
        # just came: RT = 0.025, 0.025 − 0.02 = 0.005 < 0.01, critical; basic demand 64 + 8 = 72 tokens
        req("f", 64, est=10, arrival_time=9.5, tbt_slo_s=0.025, waited_since=10.0),
    ]
    pol = CacheOptAdmission()
    order = pol.order(waiting, state)
    # critical by descending basic demand (f 72, d 24), then ascending RT (e 0.04, c 0.15, a 0.4), then b
    assert [r.request_id for r in order] == ["f", "d", "e", "c", "a", "b"]
    assert pol.decisions.snapshot() == {"slack_order": 1}
    # requests without SLOs keep arrival order: nothing decided differently, nothing counted
    assert [r.request_id for r in pol.order([req("y", 16, 10, arrival_time=2.0), req("x", 16, 10)], state)] == [
        "x",
        "y",
    ]
    assert pol.decisions.snapshot() == {"slack_order": 1}


def test_cacheopt_starts_a_critical_request_on_its_basic_demand() -> None:
    pol = CacheOptAdmission(reserve_blocks=1, buffer_tokens=0, basic_tokens=8)
    batch = (running("r", 64, est=200),)  # holds 4 blocks
    state = DecodeState(free_blocks=4, block_size=BS, running=batch, now=10.0)  # capacity 8
    late = req("x", 40, est=100, tbt_slo_s=0.05, waited_since=9.9)  # RT = 0.05 − 0.1 < 0: critical
    assert [r.request_id for r in pol.order([late], state)] == ["x"]
    # its padded demand alone, 40 + 100 tokens = 9 blocks, exceeds the capacity of 8, so the peak check refuses;
    # its basic demand 40 + 8 = 48 tokens = 3 blocks fits the free 4 less the reserve of 1
    assert pol.admit(late, state)
    assert pol.decisions.snapshot() == {"critical": 1}
    # a context of 41: 41 + 8 = 49 tokens = 4 blocks > 3
    longer = replace(late, request_id="x2", prompt_len=41)
    pol.order([longer], state)
    assert not pol.admit(longer, state)
    # the same request without an SLO is not critical, and the amortised grants leave it short of its basic
    # demand: A' = (8 − 1) × 16 = 112 tokens, E = (64 + 200) + (40 + 100) − 112 = 292, equal RT, cut by prompt
    # share 40/104: 292 × 40/104 = 112.3, grant 140 − 112.3 = 27.7 < 48
    calm = replace(late, request_id="x3", tbt_slo_s=None)
    pol.order([calm], state)
    assert pol.grants(calm, state)["x3"] == pytest.approx(140 - 292 * 40 / 104)
    assert not pol.admit(calm, state)
    assert pol.decisions.snapshot() == {"critical": 1}


def test_cacheopt_amortises_the_excess_demand_by_slack_and_prompt_weights() -> None:
    """CacheOpt §3.3.2, Σ Mᵢ > A'_kvc: cuts by wᵢ = RTᵢ/ΣRT × s_iᵖ/Σs^p, each cut request covered by a release."""
    pol = CacheOptAdmission(reserve_blocks=0, buffer_tokens=8, basic_tokens=8)
    a = running("a", 48, est=16, tbt_slo_s=0.02)  # running: RT = its SLO
    c = running("c", 48, est=80, tbt_slo_s=0.4)
    state = DecodeState(free_blocks=8, block_size=BS, running=(a, c))  # capacity 8 + 3 + 3 = 14 blocks
    n = req("n", 32, est=96, tbt_slo_s=0.5, waited_since=0.0)  # RT = 0.5
    # the padded peak check refuses: at k = 80, c holds blocks(48 + 80 + 8) = 9 and n blocks(32 + 80 + 8) = 8: 17 > 14
    assert not admits(n, state, pol.remaining, reserve=0, pad=8)
    # A' = 14 × 16 = 224 tokens; M = a 48 + 16 + 8 = 72, c 48 + 80 + 8 = 136, n 32 + 96 + 8 = 136: E = 344 − 224 = 120
    # w ∝ RT × s_p: 0.02 × 48 : 0.4 × 48 : 0.5 × 32 = 0.96 : 19.2 : 16 = 3 : 60 : 50 (of 113)
    grants = pol.grants(n, state)
    assert grants == {
        "a": pytest.approx(72 - 120 * 3 / 113),  # 68.81
        "c": pytest.approx(136 - 120 * 60 / 113),  # 72.28
        "n": pytest.approx(136 - 120 * 50 / 113),  # 82.90
    }
    # every grant covers context + B (56, 56, 40); a's covers its 48 + 16 tokens; c's runs out after 72.28 − 48 =
    # 24.3 tokens and n's after 82.90 − 32 = 50.9, both after a finishes (16) releasing 64 tokens, at least their
    # cuts (63.72 and 53.10)
    assert pol.admit(n, state)
    assert pol.decisions.snapshot() == {"amortised": 1}
    # one block less: A' = 208, E = 136, c's grant 136 − 136 × 60/113 = 63.79 runs out after 15.8 tokens, before
    # a's finish at 16: no release covers it
    tighter = replace(state, free_blocks=7)
    assert pol.grants(n, tighter)["c"] == pytest.approx(136 - 136 * 60 / 113)
    assert not pol.admit(n, tighter)
    assert pol.decisions.snapshot() == {"amortised": 1}


def test_cacheopt_counts_critical_members_at_their_basic_demand_in_the_excess() -> None:
    pol = CacheOptAdmission(reserve_blocks=0, buffer_tokens=0, basic_tokens=8)
    state = DecodeState(free_blocks=20, block_size=BS, running=(running("r", 32, est=64),), now=5.0)  # capacity 22
    late = req("k", 64, est=200, tbt_slo_s=0.01, waited_since=4.0)  # RT = −0.99: critical
    other = req("o", 16, est=50)
    pol.order([late, other], state)
    assert pol.admit(late, state)  # padded: blocks(264) = 17 + blocks(96) = 6 at k=0..64 > 22; basic 72 tokens fits
    joined = state.with_admitted(late)
    # A' = 22 × 16 = 352; D_kvc = 64 + 8 = 72 (k, critical); M = r 32 + 64 = 96, o 16 + 50 = 66: E = 96 + 66 + 72 − 352
    # < 0, so r and o keep their whole demands
    assert pol.grants(other, joined) == {"k": 72.0, "r": 96.0, "o": 66.0}


def test_tbt_slack_counts_from_the_latest_token() -> None:
    assert req("w", 16, 10, tbt_slo_s=0.2, waited_since=9.5).tbt_slack(10.0) == pytest.approx(-0.3)
    assert running("r", 16, 10, tbt_slo_s=0.2).tbt_slack(10.0) == pytest.approx(0.2)  # its token came this step
    assert req("n", 16, 10).tbt_slack(10.0) is None
