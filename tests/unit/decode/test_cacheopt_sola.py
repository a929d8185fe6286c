"""CacheOpt admission (§3.3) and SOLA decode order and peak-memory admission (§4.4.2, §5.1), hand-built states."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.unit.decode.sim import simulate, view
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import ADMISSION_NAMES, make_admission_policy
from tetriserve.decode_worker.admission.cacheopt import CacheOptAdmission
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
    assert not CacheOptAdmission(reserve_blocks=0, buffer_tokens=1).admit(newcomer, state)  # 65 tokens = 5 blocks each


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
    order = SolaDecode().order([fresh_short, long_waited, preempted, waited], state)
    assert [r.request_id for r in order] == ["waited", "pre", "long", "fresh"]


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
    if shift >= 0 and name != "greedy":  # exact or generous predictions: reservations never run out
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
