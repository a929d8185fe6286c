"""`tetriserve profile`'s plan and fit, without vLLM: FCFS derivation, scenario grids, calibration."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.common.cost_profile import CostProfile
from tetriserve.common.scls_estimators import ServingTime
from tetriserve.engine.profile_fit import MeasuredStep, calibrate
from tetriserve.engine.profile_plan import (
    Piece,
    Scenario,
    ScenarioKind,
    chunked_scenarios,
    decode_scenario,
    decode_scenarios,
    forward_sizes,
    held_out,
    pure_decode,
    simulate_fcfs,
    sweep_scenarios,
)
from tetriserve.engine.profile_report import scls_section


def _triples(step: tuple[Piece, ...]) -> list[tuple[int, int, int]]:
    return [(p.request, p.has, p.new) for p in step]


def test_fcfs_chunks_one_request_then_the_next() -> None:
    # recorded from vLLM 0.32 (3 prompts of 700, budget 256, max_tokens=1): the first iterations
    steps = simulate_fcfs([700, 700, 700], [1, 1, 1], budget=256, max_num_seqs=64)
    assert [_triples(s) for s in steps[:4]] == [
        [(0, 0, 256)],
        [(0, 256, 256)],
        [(0, 512, 188), (1, 0, 68)],
        [(1, 68, 256)],
    ]
    assert sum(p.new for s in steps for p in s) == 2100
    assert all(not p.decode for s in steps for p in s)


def test_fcfs_running_decodes_come_before_new_prefills() -> None:
    # recorded from vLLM 0.32 (16 prompts of 256, budget 2048, max_tokens 8): 2048, 8+1792+248, 15+8, 16, ...
    steps = simulate_fcfs([256] * 16, [8] * 16, budget=2048, max_num_seqs=64)
    assert [sum(p.new for p in s) for s in steps[:4]] == [2048, 2048, 23, 16]
    assert [len(s) for s in steps[:4]] == [8, 16, 16, 16]
    assert _triples(steps[1])[-1] == (15, 0, 248)
    assert steps[2][0] == Piece(0, 257, 1, True) and steps[2][-1] == Piece(15, 248, 8, False)
    assert [len(s) for s in steps[-3:]] == [16, 8, 1]  # the first eight finish one iteration earlier


def test_fcfs_respects_max_num_seqs() -> None:
    steps = simulate_fcfs([16] * 5, [1] * 5, budget=1024, max_num_seqs=2)
    assert [len(s) for s in steps] == [2, 2, 1]


def test_fcfs_validates() -> None:
    with pytest.raises(ValueError, match="budget"):
        simulate_fcfs([10], [1], budget=0, max_num_seqs=1)
    with pytest.raises(ValueError, match="max_num_seqs"):
        simulate_fcfs([10], [1], budget=8, max_num_seqs=0)


@pytest.mark.parametrize(
    ("batch", "context", "budget"), [(1, 64, 2048), (8, 1024, 2048), (32, 1024, 2048), (4, 96, 64)]
)
def test_decode_scenario_all_decode_together_then_finish(batch: int, context: int, budget: int) -> None:
    sc = decode_scenario(batch, context, budget, max_num_seqs=64, steps=16)
    steps = simulate_fcfs(sc.prompt_lens, sc.max_tokens, sc.budget, 64)
    full = [i for i, s in enumerate(steps) if pure_decode(s, batch)]
    assert len(full) == 16
    assert full == list(range(len(steps) - 16, len(steps)))  # the last 16 iterations, all B decoding
    last = steps[-1]
    assert sorted(p.has for p in last) == sorted(context + m - 2 for m in sc.max_tokens)  # samples its m-th token


def test_decode_scenarios_fit_kv_and_lengths() -> None:
    grid = decode_scenarios(2048, 2048, max_num_seqs=64, kv_capacity_tokens=1 << 20)
    assert {s.name for s in grid} >= {"decode-b1-l64", "decode-b32-l1024"}
    small = decode_scenarios(2048, 2048, max_num_seqs=8, kv_capacity_tokens=4096)
    assert all(len(s.prompt_lens) <= 8 for s in small)
    assert all(sum(s.prompt_lens) + sum(s.max_tokens) <= 0.9 * 4096 for s in small)


def test_forward_sizes() -> None:
    assert forward_sizes(128) == [16, 24, 32, 48, 64, 96, 128]
    assert forward_sizes(2047)[-3:] == [1024, 1536, 2047]
    with pytest.raises(ValueError, match="max_forward"):
        forward_sizes(8)


def test_chunked_scenarios_have_l_has_and_several_requests() -> None:
    pieces = [
        p
        for sc in chunked_scenarios(512, 2047)
        for s in simulate_fcfs(sc.prompt_lens, sc.max_tokens, sc.budget, 64)
        for p in s
    ]
    assert any(p.has > 0 for p in pieces)
    multi = [
        s
        for sc in chunked_scenarios(512, 2047)
        for s in simulate_fcfs(sc.prompt_lens, sc.max_tokens, sc.budget, 64)
        if len(s) > 1
    ]
    assert any(any(p.has > 0 for p in s) for s in multi)  # a chunk continuing beside a new prompt


def test_scenario_validates() -> None:
    with pytest.raises(ValueError, match=r"Scenario\.budget"):
        Scenario("x", ScenarioKind.SWEEP, 0, (16,), (1,))
    with pytest.raises(ValueError, match=r"Scenario\.max_tokens"):
        Scenario("x", ScenarioKind.SWEEP, 16, (16, 16), (1,))


def test_held_out_is_interior() -> None:
    names = [f"sweep-{s}" for s in forward_sizes(2047)] + ["decode-b1-l64", "decode-b2-l64", "decode-b4-l64"]
    test = held_out(names)
    assert test == {"sweep-24", "sweep-96", "sweep-384", "sweep-1536", "decode-b2-l64"}
    with pytest.raises(ValueError, match="every"):
        held_out(names, every=1)


def _synthetic_steps(p: PrefillCost, d: DecodeCost) -> list[MeasuredStep]:
    out: list[MeasuredStep] = []
    scenarios = [
        *sweep_scenarios(2047),
        *chunked_scenarios(1024, 2047),
        *decode_scenarios(2048, 2048, 64, 1 << 20),
    ]
    for sc in scenarios:
        for i, step in enumerate(simulate_fcfs(sc.prompt_lens, sc.max_tokens, sc.budget, 64)):
            if all(x.decode for x in step):
                t = d.predict([x.has for x in step])
            else:
                t = p.predict([(x.has, x.new) for x in step if not x.decode])
            out.append(MeasuredStep(sc.name, sc.kind, len(sc.prompt_lens), i, step, t, 0.01))
    return out


def test_calibrate_recovers_models_and_pivot() -> None:
    p, d = PrefillCost(2e-9, 1e-8, 3e-5, 4e-3), DecodeCost(6e-5, 3e-8, 5e-3)
    cal = calibrate(_synthetic_steps(p, d), "tiny-llama", "cpu", saturation=0.9)
    prof = cal.profile
    assert math.isclose(prof.prefill.c0, p.c0, rel_tol=1e-3) and math.isclose(prof.decode.b1, d.b1, rel_tol=1e-3)
    assert cal.prefill.test_error < 1e-3 and cal.decode.test_error < 1e-3
    assert cal.prefill.n_test > 0 and cal.decode.n_test > 0
    assert cal.prefill.noise == pytest.approx(0.01)
    best = max(s.tokens_per_s for s in prof.sweep)
    assert prof.pivot_tokens == min(s.forward_tokens for s in prof.sweep if s.tokens_per_s >= 0.9 * best)
    assert prof.pivot_seconds == pytest.approx(p.predict([(0, prof.pivot_tokens)]))
    assert prof.prefill_fit_error == cal.prefill.test_error


def test_calibrate_fits_the_scls_estimators() -> None:
    # iterations timed by SCLS's own eq. 3 (prompts started together, padded to the longest piece) and eq. 4
    # (pure decode at the longest context); the other (chunked) iterations by SOLA's model, which SCLS skips
    want = ServingTime(p1=2e-5, p2=3e-4, p3=1e-5, p4=4e-3, d1=3e-8, d2=6e-5, d3=2e-8, d4=5e-3)
    sola = PrefillCost(2e-9, 1e-8, 3e-5, 4e-3)
    steps = []
    for s in _synthetic_steps(sola, DecodeCost(6e-5, 3e-8, 5e-3)):
        if all(x.decode for x in s.pieces):
            t = want.tau_decode(max(x.has for x in s.pieces), len(s.pieces))
        elif all(x.has == 0 and not x.decode for x in s.pieces):
            t = want.t_prefill(len(s.pieces), max(x.new for x in s.pieces))
        else:
            t = s.seconds
        steps.append(replace(s, seconds=t))
    cal = calibrate(steps, "tiny-llama", "cpu", kv_bytes_per_token=2048.0, kv_pool_bytes=2048.0 * 32768)
    scls = cal.profile.scls
    assert scls is not None and cal.scls_errors is not None
    for name, value in want.to_json().items():
        assert getattr(scls.serving, name) == pytest.approx(value, rel=1e-6, abs=1e-12), name
    assert cal.scls_errors[0] < 1e-6 and cal.scls_errors[1] < 1e-6
    # Δ and M_ava as given: a pool of 32768 tokens of 2048 bytes
    assert scls.memory.n_max(1024, 128) == 25  # ⌊0.9·32768 / 1152⌋ = ⌊25.6⌋
    assert CostProfile.from_json(cal.profile.to_json()).scls == scls  # the JSON round trip
    report = "\n".join(scls_section(cal))  # the profile report's section
    assert "## SCLS estimators" in report and "Δ = 2,048 bytes" in report and "M_ava = 0.06 GiB" in report
