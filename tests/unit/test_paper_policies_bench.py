"""The pure parts of ``benchmarks/paper_policies.py``: the seeded workload every configuration replays, the
configurations' overrides, and the per-run arithmetic (percentiles, SLO attainment, counter differences)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks import paper_policies as pp

CLASSES = (pp.SloClass("tight", 250.0, 30.0), pp.SloClass("loose", 2500.0, 150.0))
PAIRS = [((1, 2, 3), 10), ((4, 5), 20), ((6, 7, 8, 9), 5)]


def test_the_workload_is_seeded_and_the_same_for_every_configuration() -> None:
    a = pp.build_workload(PAIRS, 2.0, 7, CLASSES)
    assert a == pp.build_workload(PAIRS, 2.0, 7, CLASSES)  # built again from the same seed: the same requests
    assert [(x.prompt, x.max_tokens) for x in a] == PAIRS  # the pairs in order, as given
    assert [x.rid for x in a] == ["pp-0", "pp-1", "pp-2"]
    assert a[0].offset_s == 0.0 and a[0].offset_s < a[1].offset_s < a[2].offset_s
    assert {x.slo for x in a} <= set(CLASSES)
    assert pp.build_workload(PAIRS, 2.0, 8, CLASSES) != a  # another seed, other arrivals


def test_poisson_arrivals_come_at_the_rate() -> None:
    many = pp.build_workload([((1,), 1)] * 2001, 2.0, 0, CLASSES)
    gap = many[-1].offset_s / 2000  # 2000 gaps; exponential with mean 1 / 2.0 = 0.5 s
    assert 0.45 < gap < 0.55
    tight = sum(x.slo.name == "tight" for x in many)
    assert 900 < tight < 1100  # each class with probability 1/2


def test_every_configuration_shares_the_base_and_the_profile() -> None:
    default = pp.cluster_overrides("colocated", "default", "/p.json", True)
    assert default == {**pp.BASE_OVERRIDES, "mode": "colocated", "prefill.cost_profile": "/p.json"}
    for name in pp.CONFIGS:
        o = pp.cluster_overrides("disaggregated", name, "/p.json", True)
        assert o["prefill.cost_profile"] == "/p.json" and o["mode"] == "disaggregated"
        assert {k: o[k] for k in pp.BASE_OVERRIDES} == pp.BASE_OVERRIDES
    assert pp.cluster_overrides("colocated", "scls", "/p.json", True)["decode.admission.cost_profile"] == "/p.json"
    assert "decode.admission.cost_profile" not in pp.cluster_overrides("colocated", "scls", "/p.json", False)
    assert pp.cluster_overrides("colocated", "sola", "/p.json", True)["preset"] == "sola"  # the paper's preset


def test_slo_classes_parse() -> None:
    assert pp.parse_classes("tight:250:30, loose:2500:150") == CLASSES


def _o(rid: str, slo: pp.SloClass, tokens: int, ttft: float, tbt: float, jct: float) -> pp.Outcome:
    return pp.Outcome(rid, slo.name, slo.ttft_ms, slo.tbt_ms, 10, tokens, ttft, tbt, jct)


def test_attainment_on_a_hand_built_run() -> None:
    tight, loose = CLASSES
    outcomes = [
        _o("a", tight, 10, 0.100, 0.020, 1.0),  # TTFT 100 <= 250 ms, TBT 20 <= 30 ms: both met
        _o("b", tight, 10, 0.300, 0.010, 2.0),  # TTFT 300 > 250 ms: missed; TBT met
        _o("c", loose, 10, 1.000, 0.200, 3.0),  # TTFT 1000 <= 2500 ms met; TBT 200 > 150 ms: missed
        _o("d", loose, 5, 0.010, 0.001, 0.5),  # 5 of its 10 tokens: incomplete, misses both
    ]
    s = pp.summarize(outcomes, 7.0)
    assert s["requests"] == 4 and s["incomplete"] == 1
    assert s["attain_ttft"] == 0.5  # a, c of 4
    assert s["attain_tbt"] == 0.5  # a, b of 4
    assert s["attain_both"] == 0.25  # a of 4
    assert s["throughput_tok_s"] == 5.0  # (10 + 10 + 10 + 5) tokens / 7 s
    # over the complete ones: TTFT 0.1, 0.3, 1.0 s; p99 rank (3 - 1) * 0.99 = 1.98: 0.3 + 0.98 * (1.0 - 0.3)
    assert math.isclose(s["ttft_p50_ms"], 300.0)
    assert math.isclose(s["ttft_p99_ms"], 986.0)
    assert math.isclose(s["jct_mean_s"], 2.0)  # (1 + 2 + 3) / 3
    assert math.isclose(s["tbt_p50_ms"], 20.0)  # of 20, 10, 200 ms


def test_the_class_breakdown_pools_the_rounds_per_class() -> None:
    tight, loose = CLASSES
    run1 = [_o("a", tight, 10, 0.100, 0.020, 1.0), _o("c", loose, 10, 1.000, 0.200, 3.0)]
    run2 = [_o("b", tight, 10, 0.300, 0.010, 2.0), _o("d", loose, 5, 0.010, 0.001, 0.5)]
    rounds = [{"outcomes": [[getattr(o, f) for f in pp.OUTCOME_FIELDS] for o in run]} for run in (run1, run2)]
    per = pp.by_class(rounds)
    # tight: a (both met, JCT 1 s) and b (TTFT missed, JCT 2 s); loose: c (TBT missed, JCT 3 s), d incomplete
    assert per["tight"] == {"requests": 2.0, "attain_ttft": 0.5, "attain_tbt": 1.0, "jct_mean_s": 1.5}
    assert per["loose"] == {"requests": 2.0, "attain_ttft": 0.5, "attain_tbt": 0.0, "jct_mean_s": 3.0}
    table = pp.class_table({"default": rounds})
    assert "| default | 50% | 100% | 1.50 | 50% | 0% | 3.00 |" in table


def test_a_set_override_wins_over_the_preset() -> None:
    o = pp.cluster_overrides("disaggregated", "accelgen", None, False, {"decode.preemption.order": "vllm"})
    assert o["preset"] == "accelgen" and o["decode.preemption.order"] == "vllm"


def test_one_token_has_no_gap_and_meets_its_tbt() -> None:
    one = pp.Outcome("x", "tight", 250.0, 30.0, 1, 1, 0.05, None, 0.05)
    assert one.met_tbt and one.met_ttft


def test_percentile_counters_and_rotation() -> None:
    assert pp.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5  # rank 1.5: halfway between 2 and 3
    assert math.isnan(pp.percentile([], 50))
    assert pp.counter_diff({"a": 1, "b": 2}, {"a": 3, "b": 2, "c": 1}) == {"a": 2, "c": 1}
    assert pp.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert pp.rotated(["a", "b", "c"], 3) == ["a", "b", "c"]


def test_the_verdict_says_which_way_each_metric_moved() -> None:
    base = {"attain_both": 0.5, "jct_mean_s": 2.5}
    line = pp.verdict("accelgen", {"attain_both": 0.75, "jct_mean_s": 2.0}, base)
    assert line.startswith("- AccelGen predicts SLO attainment moves up (§6): ")
    assert "SLO attainment moves up (§6): measured 1.50x (0.75 vs 0.5), moved as predicted" in line  # 0.75 / 0.5
    assert "mean JCT moves down (§6): measured 0.80x (2 vs 2.5), moved as predicted" in line  # 2.0 / 2.5
    worse = pp.verdict("accelgen", {"attain_both": 0.25, "jct_mean_s": 2.5}, base)
    assert "0.50x (0.25 vs 0.5), moved the other way" in worse and "1.00x (2.5 vs 2.5), unchanged" in worse
    close = pp.verdict(
        "scls", {"throughput_tok_s": 1030.0, "jct_mean_s": 2.0}, {"throughput_tok_s": 1000.0, "jct_mean_s": 2.5}
    )
    assert "1.03x (1.03e+03 vs 1e+03), within 5% of the default: no clear move" in close  # 1030 / 1000
    assert "0.80x (2 vs 2.5), moved as predicted" in close


def test_a_measured_profile_is_recorded_by_its_command_and_fit(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"prefill": {"a0": 1.0}, "decode": {"a1": 2.0}, "pivot_tokens": 96, "sweep": []}))
    args = argparse.Namespace(cost_profile=None, profile_repeats=2)
    record = pp.profile_record(args, str(profile))
    assert record == {
        "command": "tetriserve profile --out <scratch> --threads 1 --repeats 2",
        "prefill": {"a0": 1.0},
        "decode": {"a1": 2.0},
        "pivot_tokens": 96,
        "scls_section": False,
    }
    assert str(tmp_path) not in pp.profile_text(record) and "pivot 96 tokens" in pp.profile_text(record)
    given = pp.profile_record(argparse.Namespace(cost_profile=str(profile), profile_repeats=1), str(profile))
    assert given["given"] == str(profile) and "command" not in given
