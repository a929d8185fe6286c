"""The pure parts of ``benchmarks/tetriinfer_e2e.py``: the workloads' selection, the per-seed comparison with its
interval, the run order and the report."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest

from benchmarks import tetriinfer_e2e as te


def _pair(prompt_tokens: int, answer_tokens: int, i: int = 0) -> te.Pair:
    return te.Pair(f"p{prompt_tokens}-{answer_tokens}-{i}", f"a{i}", prompt_tokens, answer_tokens)


def test_a_pair_is_classed_as_tetriinfer_does_and_kept_as_the_client_keeps_it() -> None:
    assert _pair(512, 128).workload == "LPLD"  # heavy is strictly over 512 prompt / 128 answer tokens
    assert _pair(513, 129).workload == "HPHD"
    assert _pair(100, 300).workload == "LPHD" and _pair(900, 20).workload == "HPLD"
    assert _pair(4, 4).client_keeps and not _pair(3, 50).client_keeps and not _pair(50, 3).client_keeps
    # the client's bounds less the Poisson run's tag (8 tokens): prompts of 1016 at most, 2040 in all at most
    assert _pair(1016, 10).client_keeps and not _pair(1017, 10).client_keeps
    assert _pair(1000, 1040).client_keeps and not _pair(1000, 1041).client_keeps


def test_choose_draws_only_the_workload_the_client_keeps_and_is_seeded() -> None:
    pairs = [_pair(100, 50, i) for i in range(10)] + [_pair(600, 50, i) for i in range(3)] + [_pair(2, 50)]
    lp = te.choose(pairs, "LPLD", 5, seed=0)
    assert len(lp) == 5 and all(p.workload == "LPLD" for p in lp)
    assert lp == te.choose(pairs, "LPLD", 5, seed=0) and lp != te.choose(pairs, "LPLD", 5, seed=1)
    assert len(te.choose(pairs, "Mixed", 13, seed=0)) == 13  # 14 pairs, the 2-token prompt left out
    with pytest.raises(ValueError, match="HPLD: 3 usable"):
        te.choose(pairs, "HPLD", 4, seed=0)


def test_a_seed_never_sends_a_prompt_twice() -> None:
    assert te.WARMUP == 8
    pairs = [_pair(100, 50, i) for i in range(16)] + [_pair(600, 50, i) for i in range(3)]
    pairs += [_pair(100, 50, 0)]  # the same prompt text again: drawn once at most
    d = te.draw(pairs, ["LPLD", "HPLD", "Mixed"], 4, seed=0)
    prompts = [p.prompt for p in d.every()]
    # LPLD 4, HPLD 3 (all the pool has), Mixed 4, each twice (burst, then tagged), and the warm-up's 8: 30 distinct
    assert len(prompts) == len(set(prompts)) == 2 * (4 + 3 + 4) + 8
    assert [len(v) for v in d.burst.values()] == [4, 3, 4] and list(d.burst) == ["LPLD", "HPLD", "Mixed"]
    assert all(p.workload == "HPLD" for p in d.burst["HPLD"])
    again = d.poisson["LPLD"][0]
    assert again.prompt == "(again) " + d.burst["LPLD"][0].prompt and again.answer_tokens == 50
    with pytest.raises(ValueError, match="Mixed: 7 usable ShareGPT pairs, 8 wanted"):  # the warm-up: 15 - 4 - 4
        te.draw([*pairs[1:-1], _pair(600, 50, 9)], ["LPLD", "HPLD", "Mixed"], 4, seed=0)


def test_the_files_the_client_and_the_oracle_read() -> None:
    chosen = [_pair(100, 50, 1)]
    assert te.sharegpt_file(chosen) == [
        {"id": "t0", "conversations": [{"from": "human", "value": "p100-50-1"}, {"from": "gpt", "value": "a1"}]}
    ]
    assert [json.loads(line) for line in te.oracle_lines(chosen)] == [{"prompt": "p100-50-1", "response_len": 50}]


def test_figures_of_a_saved_client_run() -> None:
    saved = {"completed": 2, "failed": 0, "duration": 4.0, "total_output_tokens": 30, "ttfts": [0.1, 0.3],
             "latencies": [1.0, 2.0]}  # fmt: skip
    f = te.figures(saved)
    assert f == {"completed": 2.0, "failed": 0.0, "duration_s": 4.0, "output_tokens": 30.0, "ttft_mean_ms": 200.0,
                 "jct_mean_ms": 1500.0}  # fmt: skip
    assert te.capacity(f) == 0.5  # 2 requests over 4 s
    assert te.perf_per_cpu({**f, "server_cpu_s": 6.0}) == 5.0  # 30 tokens / 6 CPU-s


def test_the_interval_and_the_claim() -> None:
    # [-0.4, -0.45, -0.5]: mean -0.45, sd 0.05, half 4.303 * 0.05 / sqrt(3) = 0.12422
    m, lo, hi = te.interval([-0.4, -0.45, -0.5])
    assert math.isclose(m, -0.45)
    assert math.isclose(lo, -0.57422, abs_tol=1e-5) and math.isclose(hi, -0.32578, abs_tol=1e-5)
    assert te.direction(lo, hi, lower_is_better=True) == "better"
    assert te.direction(lo, hi, lower_is_better=False) == "worse"
    # [-0.1, -0.2, -0.3]: mean -0.2, sd 0.1, half 0.24844: [-0.448, 0.048] spans zero
    _, lo, hi = te.interval([-0.1, -0.2, -0.3])
    assert te.direction(lo, hi, True) == "no claim"
    assert math.isnan(te.interval([0.5])[1])  # one seed: no interval, no claim
    assert te.direction(math.nan, math.nan, True) == "no claim"


def _run(ttft: float, jct: float, tokens: float, cpu: float) -> dict[str, Any]:
    burst = {"completed": 4.0, "failed": 0.0, "duration_s": 2.0, "output_tokens": tokens, "ttft_mean_ms": 1.0,
             "jct_mean_ms": 1.0, "server_cpu_s": cpu}  # fmt: skip
    poisson = {**burst, "ttft_mean_ms": ttft, "jct_mean_ms": jct}
    return {"burst": burst, "poisson": poisson, "rate": 1.4}


def test_compare_takes_the_change_per_seed() -> None:
    runs = {
        "0": {"LPLD": {"tetriinfer": _run(60, 600, 200, 10), "vllm": _run(100, 1000, 200, 20)}},
        "1": {"LPLD": {"tetriinfer": _run(50, 700, 200, 10), "vllm": _run(100, 1000, 200, 10)}},
    }
    c = te.compare(runs, "LPLD", "tetriinfer", "vllm")
    assert math.isclose(float(c["ttft"]["change"]), -0.45)  # -40% and -50%
    assert math.isclose(float(c["jct"]["change"]), -0.35)  # -40% and -30%
    assert math.isclose(float(c["perf"]["change"]), 0.5)  # 20 vs 10 tokens/CPU-s (+100%), then 20 vs 20 (0%)
    assert c["ttft"]["seeds"] == 2.0
    # two seeds: t = 12.706; ttft sd 0.0707: half 12.706 * 0.0707 / sqrt(2) = 0.635, the interval spans zero
    assert c["ttft"]["claim"] == "no claim"
    text = te.report({"args": {"num_prompts": 4, "seeds": [0, 1], "load": 0.7, "systems": ["tetriinfer", "vllm"],
                               "workloads": ["LPLD"]}, "runs": runs})  # fmt: skip
    assert "## tetriinfer against vllm" in text and "| LPLD | -45% [" in text and "-44% / -40% / 1.4×" in text


def test_colocated_runs_first_and_the_rest_rotate() -> None:
    systems = ["tetriinfer", "colocated", "vllm", "vllm-2t"]
    assert te.run_order(systems, 0) == ["colocated", "tetriinfer", "vllm", "vllm-2t"]
    assert te.run_order(systems, 1) == ["colocated", "vllm", "vllm-2t", "tetriinfer"]


def test_a_variant_of_the_preset_is_also_compared_with_the_preset() -> None:
    runs = {
        s: {"HPLD": {"tetriinfer": _run(100, 1000, 200, 20), "tetriinfer-shared": _run(80, 900, 200, 10)}}
        for s in ("0", "1")
    }
    text = te.report({"args": {"num_prompts": 4, "seeds": [0, 1], "load": 0.7, "workloads": ["HPLD"],
                               "systems": ["tetriinfer", "tetriinfer-shared"]}, "runs": runs})  # fmt: skip
    assert "## tetriinfer-shared against tetriinfer" in text
    assert "## tetriinfer against tetriinfer-shared" not in text
    # the same change in both seeds: TTFT 80 / 100 - 1 = -20%, a zero-width interval that excludes zero
    assert "| HPLD | -20% [-20%, -20%] better |" in text


def test_the_plot_is_written_beside_the_report(tmp_path: Any) -> None:
    runs = {s: {"LPLD": {"tetriinfer": _run(60, 600, 200, 10), "vllm": _run(100, 1000, 200, 20)}} for s in "01"}
    data = {"args": {"num_prompts": 4, "seeds": [0, 1], "load": 0.7, "systems": ["tetriinfer", "vllm"],
                     "workloads": ["LPLD"], "out": str(tmp_path / "e2e")}, "runs": runs}  # fmt: skip
    assert "![each change with its interval, beside the paper's](e2e.png)" in te.report(data)
    te.plot(data, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").read_bytes()[:4] == b"\x89PNG"


def test_the_resources_of_the_bursts_by_process() -> None:
    before = {"1": ("VLLM::EngineCore", 10.0), "2": ("vllm.entrypoints.openai.api_server", 3.0)}
    after = {"1": ("VLLM::EngineCore", 14.0), "2": ("vllm.entrypoints.openai.api_server", 4.0), "3": ("ray", 0.5)}
    used = te.cpu_by_label(before, after)
    assert used == {"VLLM::EngineCore": 4.0, "vllm.entrypoints.openai.api_server": 1.0, "ray": 0.5}
    assert list(used) == ["VLLM::EngineCore", "vllm.entrypoints.openai.api_server", "ray"]  # largest first
    assert te.engine_busy("vllm-2t", after) == 14.0  # plain vLLM: its engine processes' CPU-seconds
    assert te.engine_busy("vllm", {**after, "4": ("VLLM::Worker", 20.0)}) == 34.0  # its model worker's too

    def run(seed_busy: float) -> dict[str, Any]:
        r = _run(1, 1, 1, 5.5)
        r["burst"] |= {"engine_busy_s": seed_busy, "client_cpu_s": 2.0}
        return {**r, "server_cpu_by_process": used}

    runs = {s: {w: {"vllm": run(b)} for w in ("LPLD", "HPLD")} for s, b in (("0", 3.0), ("1", 5.0))}
    runs["0"]["LPLD"]["colocated"] = _run(1, 1, 1, 1)  # recorded no resources: left out
    lines = te.cpu_table({"runs": runs}, top=2)
    # per seed summed over the two workloads (6 and 10 busy seconds), then averaged
    assert (
        "| vllm | 8.0 | 11.0 | VLLM::EngineCore 8.0; vllm.entrypoints.openai.api_server 2.0; the rest 1.0 | 4.0 |"
        in lines
    )
    assert not any(line.startswith("| colocated") for line in lines)
    assert te.cpu_table({"runs": {"0": {"LPLD": {"colocated": _run(1, 1, 1, 1)}}}}) == []


def test_a_resumed_run_adds_systems_to_the_saved_one(tmp_path: Any) -> None:
    saved = {"args": {"workloads": ["LPLD"], "num_prompts": 4, "load": 0.7, "systems": ["colocated", "vllm"]},
             "runs": {"0": {"LPLD": {"colocated": _run(1, 1, 1, 1)}}}, "done": [2, 2]}  # fmt: skip
    (tmp_path / "e2e.json").write_text(json.dumps(saved))

    def args(**kw: Any) -> Any:
        base = {"out": str(tmp_path / "e2e"), "workloads": ["LPLD"], "num_prompts": 4, "load": 0.7, "seeds": [0],
                "systems": ["vllm-2t"]}  # fmt: skip
        return argparse.Namespace(**(base | kw))

    data = te.resumed(args(), {"command": "c", "commit": "x", "date": "d"})
    assert data["args"]["systems"] == ["colocated", "vllm", "vllm-2t"] and data["resumed"][0]["command"] == "c"
    with pytest.raises(SystemExit, match="differs in num_prompts"):
        te.resumed(args(num_prompts=8), {})
    with pytest.raises(SystemExit, match=r"no colocated bursts for seeds \[1\]"):
        te.resumed(args(seeds=[0, 1]), {})
