"""SCLS serving time-oriented batching (§4.4, Algorithm 1, eq. 10) and the scls decode admission policy."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tetriserve.common.config import DecodeConfig
from tetriserve.common.scls_estimators import MemoryEstimator, ServingTime
from tetriserve.decode_worker.admission import make_admission_policy
from tetriserve.decode_worker.admission.scls import SclsAdmission, serving_time_batches
from tetriserve.decode_worker.planner import DecodePlanner
from tetriserve.decode_worker.policy import decode_policies, decode_policy_settings, updated_decode_config
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

BS = 16
# padding-sensitive coefficients: T_prefill = 1e-4·N·L + 0.1, τ_decode = 1e-5·N·l + 0.02
FIG11 = ServingTime(p1=1e-4, p2=0.0, p3=0.0, p4=0.1, d1=1e-5, d2=0.0, d3=0.0, d4=0.02)
NEVER = MemoryEstimator(m_ava=1e12)


def partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every set partition of ``items`` (Bell(n) of them)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in partitions(rest):
        yield [[head], *part]
        for k in range(len(part)):
            yield [*part[:k], [head, *part[k]], *part[k + 1 :]]


def brute_force(lengths: list[int], s: int, est: ServingTime, mem: MemoryEstimator) -> float:
    """The least total serving time over every partition into batches that pass the memory test (a request
    alone always may), each batch padded to its longest input."""
    best = float("inf")
    for part in partitions(list(range(len(lengths)))):
        total = 0.0
        for b in part:
            li = max(lengths[k] for k in b)
            if len(b) > 1 and mem.oom(len(b), li, s):
                break
            total += est.t_serve(len(b), li, s)
        else:
            best = min(best, total)
    return best


def test_figure_11_two_batches_beat_one() -> None:
    # SCLS Fig. 11: 15 requests of input 10 and one of 1024, S = 128.
    # together: T_serve(16, 1024, 128) = (1e-4·16·1024 + 0.1) + (1e-5·16·(128·1024 + 128·129/2) + 128·0.02)
    #                                  = 1.7384 + (1e-5·16·139328 + 2.56) = 1.7384 + 24.85248 = 26.59088
    assert FIG11.t_serve(16, 1024, 128) == pytest.approx(26.59088)
    # apart: T_serve(15, 10, 128) = (0.015 + 0.1) + (1e-5·15·(1280 + 8256) + 2.56) = 0.115 + 3.9904 = 4.1054
    #        T_serve(1, 1024, 128) = (0.1024 + 0.1) + (1e-5·139328 + 2.56) = 0.2024 + 3.95328 = 4.15568
    lengths = [10] * 15 + [1024]
    batches, total = serving_time_batches(lengths, 128, FIG11.t_serve, NEVER.oom)
    assert total == pytest.approx(8.26108)  # 4.1054 + 4.15568
    assert batches == [[15], list(range(15))]  # the long one alone, appended first; the 15 short ones together


def test_memory_splits_a_batch() -> None:
    # no padding cost (p1 = d1 = 0): one batch would be cheapest, but ζ·M_ava = 0.9·1000 = 900 tokens holds
    # at most ⌊900 / (100 + 50)⌋ = 6 requests of 100 tokens for a slice of 50
    flat = ServingTime(p1=0.0, p2=0.0, p3=0.0, p4=1.0, d1=0.0, d2=0.0, d3=0.0, d4=0.0)
    mem = MemoryEstimator(m_ava=1000)
    batches, total = serving_time_batches([100] * 7, 50, flat.t_serve, mem.oom)
    # T[1..6] = 1 (one batch); T[7] = T[6] + T_serve(1) = 2, and no split j does strictly better (all give 2),
    # so the split recorded is P[7] = 6: the seventh alone, the first six together
    assert total == 2.0
    assert batches == [[6], [0, 1, 2, 3, 4, 5]]


def test_a_request_alone_is_a_batch_even_past_the_memory() -> None:
    mem = MemoryEstimator(m_ava=100)  # ζ·M_ava = 90 tokens < 200 + 50
    batches, total = serving_time_batches([200, 200], 50, FIG11.t_serve, mem.oom)
    assert batches == [[1], [0]]
    # 2·T_serve(1, 200, 50) = 2·((0.02 + 0.1) + (1e-5·(50·200 + 50·51/2) + 50·0.02))
    #                       = 2·(0.12 + (1e-5·11275 + 1.0)) = 2·(0.12 + 1.11275) = 2.4655
    assert total == pytest.approx(2.4655)


@pytest.mark.parametrize("seed", range(60))
def test_algorithm_1_is_optimal_against_every_partition(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    lengths = [rng.choice([1, 8, 16, 64, 100, 256, 300]) for _ in range(n)]
    s = rng.choice([1, 16, 128])
    est = ServingTime(*(rng.choice([0.0, 1e-5, 1e-4, 1e-3, 0.05]) for _ in range(8)))
    mem = MemoryEstimator(m_ava=rng.choice([300.0, 1000.0, 3000.0, 1e9]))
    batches, total = serving_time_batches(lengths, s, est.t_serve, mem.oom)
    assert total == pytest.approx(brute_force(lengths, s, est, mem))
    assert sorted(k for b in batches for k in b) == list(range(n))  # every request in one batch
    recomputed = sum(est.t_serve(len(b), max(lengths[k] for k in b), s) for b in batches)
    assert recomputed == pytest.approx(total)


def view(rid: str, context: int, arrival: float, held: int = 0, max_tokens: int = 1000) -> DecodeReqView:
    return DecodeReqView(rid, context, max_tokens, arrival_time=arrival, held_blocks=held)


def test_policy_admits_the_longest_batch_first() -> None:
    # Fig. 11's requests waiting with their KV landed; the long one arrived last
    waiting = [view(f"s{k}", 10, float(k), held=1) for k in range(15)] + [view("long", 1024, 15.0, held=64)]
    policy = SclsAdmission(slice_iters=128, serving=FIG11)
    planner = DecodePlanner(admission=policy, slice_iters=128)
    state = DecodeState(free_blocks=10_000, block_size=BS)
    first = planner.admit(waiting, state)
    # batches: the long one alone (4.15568 s) and the 15 short ones (4.1054 s): the longer goes first
    assert first.admitted == ("long",)
    assert first.held == tuple(f"s{k}" for k in range(15))
    assert policy.decisions.snapshot() == {"split": 1, "reordered": 1, "held": 1}
    # next step the long one runs; the 15 short ones are all that wait, one batch, all admitted
    running = replace(waiting[-1], generated=1, held_blocks=blocks_for(1025, BS))
    second = planner.admit(waiting[:15], DecodeState(free_blocks=10_000, block_size=BS, running=(running,)))
    assert second.admitted == tuple(f"s{k}" for k in range(15)) and second.held == ()
    assert policy.decisions.snapshot() == {"split": 1, "reordered": 1, "held": 1}


def test_policy_holds_what_the_slice_would_not_fit() -> None:
    # a pool of 100 blocks of 16 = 1600 tokens, ζ·M_ava = 1440. The running request holds 500 tokens and may
    # generate 1000 more: its next slice takes it to 500 + 128 = 628, leaving 1440 − 628 = 812 tokens
    running = view("run", 500, 0.0, held=blocks_for(500, BS))
    state = DecodeState(free_blocks=100 - running.held_blocks, block_size=BS, running=(running,))
    # two waiting of 300: together (300 + 128)·2 = 856 > 812; alone 428 ≤ 812
    waiting = [view("a", 300, 1.0), view("b", 300, 2.0)]
    policy = SclsAdmission(slice_iters=128, serving=FIG11)
    got = DecodePlanner(admission=policy).admit(waiting, state)
    assert got.admitted == ("a",) and got.held == ("b",)  # greedy would take both: 19 + 19 blocks are free
    assert policy.decisions.snapshot() == {"split": 1, "held": 1}


def test_an_empty_engine_runs_a_request_larger_than_the_slice_memory() -> None:
    # ζ·M_ava = 0.9·(100·16) = 1440 < 1400 + 128 = 1528, yet it fits the free KV now and nothing runs
    state = DecodeState(free_blocks=100, block_size=BS)
    got = DecodePlanner(admission=SclsAdmission()).admit([view("big", 1400, 0.0)], state)
    assert got.admitted == ("big",)


def test_registered_with_its_parameters() -> None:
    policy = make_admission_policy("scls", slice_iters=64, zeta=0.8)
    assert isinstance(policy, SclsAdmission) and policy.slice_iters == 64 and policy.zeta == 0.8
    with pytest.raises(ValueError, match="S must be >= 1"):
        SclsAdmission(slice_iters=0)
    with pytest.raises(ValueError, match="zeta"):
        SclsAdmission(zeta=0.0)


def test_scls_takes_the_papers_slice_length_unless_one_is_set() -> None:
    # SCLS §5.1: S = 128
    cfg = DecodeConfig.model_validate({"admission": {"policy": "scls"}})
    assert cfg.slice_iters == 128 and "slice_iters" not in cfg.model_fields_set
    assert DecodeConfig.model_validate({"admission": {"policy": "scls"}, "slice_iters": 32}).slice_iters == 32
    assert DecodeConfig().slice_iters == 0  # slicing stays off under the other policies
    # a switch away at run time finds slice_iters at its own default again, and back at 128 on return
    greedy = updated_decode_config(cfg, {"admission.policy": "greedy"})
    assert greedy.slice_iters == 0
    assert updated_decode_config(greedy, {"admission.policy": "scls"}).slice_iters == 128


def test_scls_parameters_belong_to_it() -> None:
    cfg = DecodeConfig.model_validate({"admission": {"policy": "scls", "zeta": 0.8}})
    admission, _, _ = decode_policies(cfg)
    assert isinstance(admission, SclsAdmission) and admission.zeta == 0.8 and admission.slice_iters == 128
    assert admission.serving == ServingTime()  # no profile: the tiny model's fitted values
    with pytest.raises(ValueError, match=r"decode\.admission\.zeta: a parameter of scls"):
        DecodeConfig.model_validate({"admission": {"policy": "greedy", "zeta": 0.8}})
    assert decode_policy_settings(cfg)["admission.zeta"] == "0.8"


def test_scls_reads_its_estimator_from_the_cost_profile(tmp_path: Path) -> None:
    sola = {"a0": 0.0, "b0": 0.0, "c0": 1e-5, "d0": 1e-3}
    base = {"model": "m", "hardware": "h", "prefill": sola, "decode": {"a1": 0.0, "b1": 0.0, "c1": 1e-3}}
    base |= {"pivot_tokens": 64, "pivot_seconds": 0.004}
    with_scls = tmp_path / "scls.json"
    scls = {"serving": FIG11.to_json(), "kv_bytes_per_token": 2048.0, "kv_pool_bytes": 2048.0 * 4096}
    with_scls.write_text(json.dumps(base | {"scls": scls}))
    cfg = DecodeConfig.model_validate({"admission": {"policy": "scls", "cost_profile": str(with_scls)}})
    admission, _, _ = decode_policies(cfg)
    assert isinstance(admission, SclsAdmission) and admission.serving == FIG11
    # the default profile of this model on this hardware, found without a setting
    plain = DecodeConfig.model_validate({"admission": {"policy": "scls"}})
    admission, _, _ = decode_policies(plain, default_profile=with_scls)
    assert isinstance(admission, SclsAdmission) and admission.serving == FIG11
    # a named profile without the section is refused, naming the command that writes it
    without = tmp_path / "sola-only.json"
    without.write_text(json.dumps(base))
    bad = DecodeConfig.model_validate({"admission": {"policy": "scls", "cost_profile": str(without)}})
    with pytest.raises(ValueError, match="no scls section: rerun `tetriserve profile`"):
        decode_policies(bad)
    admission, _, _ = decode_policies(plain, default_profile=without)  # a default one without it: built-in
    assert isinstance(admission, SclsAdmission) and admission.serving == ServingTime()
