"""Before against after: two commits of tetriserve, each side by side with plain vLLM, in interleaved pairs.

Each side runs ``benchmarks/vllm_bench_serve.py`` as its own commit has it, from a detached worktree of that
commit (``checkout_env``: every process of its server imports that commit's code), one round of its three
scenarios against a fresh plain vLLM server each time:

    python benchmarks/vllm_bench_two_commits.py --before 0d57bfc --after HEAD --pairs 3 \\
        --num-prompts 60 --single-prompts 15 --request-rate 2 --seed 0

The pairs interleave — before then after, then after then before, and so on — so that the machine's drift
falls on both sides alike, and every comparison is made on the ratio to the vLLM run beside it, minutes apart,
not on raw times. Per metric the report lists each run's ratio (tetriserve / vLLM), the spread of the before
runs, and after / before on the medians; it is judged within the spread where the after median lies inside the
before runs' range, and no worse where it is not beyond the worst before run. The handoff is the wait from a
response's first token to its second at 2 req/s (on tetriserve, the prefill worker's handoff to the decode
worker): its p50 and p99 over the responses of two tokens or more, in ms.

Writes ``benchmarks/results/vllm_bench_two_commits.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_results import RESULTS, ROOT, WORK, run_facts
from vllm_bench_report import checkout_env, provenance

METRICS = (  # (scenario, metric, which way is better)
    ("rate", "median_ttft_ms", "lower"),
    ("rate", "median_tpot_ms", "lower"),
    ("rate", "median_e2el_per_token_ms", "lower"),
    ("single", "median_e2el_per_token_ms", "lower"),
    ("saturation", "output_throughput", "higher"),
)
HANDOFF = (("rate", "handoff_p50_ms"), ("rate", "handoff_p99_ms"))


def resolve(commit: str) -> str:
    done = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def side_results(commit: str) -> Path:
    """Where ``commit``'s runs write their results: the results folder of its scratch worktree."""
    return WORK / f"code_{commit}" / "benchmarks" / "results"


def run_side(commit: str, out: str, args: argparse.Namespace) -> dict[str, Any]:
    """One round of ``commit``'s side by side; its figures (``read_side``)."""
    tree = WORK / f"code_{commit}"
    results = side_results(commit)
    env = checkout_env(commit, dict(os.environ, TETRISERVE_BENCH_RESULTS=str(results)))
    command = [
        sys.executable,
        str(tree / "benchmarks" / "vllm_bench_serve.py"),
        "--rounds",
        "1",
        "--num-prompts",
        str(args.num_prompts),
        "--single-prompts",
        str(args.single_prompts),
        "--request-rate",
        str(args.request_rate),
        "--seed",
        str(args.seed),
        "--out",
        out,
    ]
    print(f"==> {commit[:10]}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return read_side(commit, out)


def read_side(commit: str, out: str) -> dict[str, Any]:
    """A run's figures: per system and scenario the client's summary, and the rate scenario's handoff
    percentiles."""
    results = side_results(commit)
    summary = json.loads((results / f"{out}.json").read_text())["results"]
    per_request = json.loads((results / f"{out}_per_request.json").read_text())
    figures = {system: {scenario: runs[0] for scenario, runs in by.items()} for system, by in summary.items()}
    run = per_request["rate"]["tetriserve 1"]
    gaps = sorted(1e3 * g for g, n in zip(run["first_itls"], run["output_lens"], strict=True) if n >= 2)
    handoff = {"handoff_p50_ms": _pct(gaps, 50), "handoff_p99_ms": _pct(gaps, 99)}
    return {"commit": commit, "figures": figures, "handoff": handoff}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, round(q / 100 * (len(values) - 1))))
    return values[k]


def ratio(side: dict[str, Any], scenario: str, metric: str) -> float:
    t, v = side["figures"]["tetriserve"][scenario][metric], side["figures"]["vllm"][scenario][metric]
    return t / v if v else float("nan")


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, facts: dict[str, str]) -> list[str]:
    before, after = runs["before"], runs["after"]
    lines = ["# Before / after: tetriserve at two commits, each beside plain vLLM", "", *provenance(facts)]
    lines += [
        f"Before: {before[0]['commit'][:10]}; after: {after[0]['commit'][:10]}; {args.pairs} interleaved pairs "
        f"(the order alternates pair by pair), each side one round of `vllm_bench_serve.py` at its own commit: "
        f"{args.num_prompts} prompts at {args.request_rate} req/s and at once, {args.single_prompts} one at a time, "
        f"seed {args.seed}.  ",
        "",
        "## Ratios to plain vLLM (tetriserve / vLLM), each run beside its own vLLM run",
        "",
        "| scenario | metric | better | before runs | after runs | before spread | after / before (medians) | "
        "within the spread | no worse than the worst before run |",
        "| --- | --- | --- | --- | --- | --- | ---: | --- | --- |",
    ]
    verdicts = []
    for scenario, metric, better in METRICS:
        b = [ratio(r, scenario, metric) for r in before]
        a = [ratio(r, scenario, metric) for r in after]
        mid = statistics.median(a)
        within = min(b) <= mid <= max(b)
        no_worse = mid <= max(b) if better == "lower" else mid >= min(b)
        verdicts.append(no_worse)
        lines.append(
            f"| {scenario} | {metric} | {better} | {', '.join(f'{x:.2f}' for x in b)} | "
            f"{', '.join(f'{x:.2f}' for x in a)} | {min(b):.2f}–{max(b):.2f} | "
            f"{mid / statistics.median(b):.2f} | {'yes' if within else 'no'} | {'yes' if no_worse else 'no'} |"
        )
    lines += [
        "",
        "## The handoff at 2 req/s: first token → second token, ms (tetriserve alone)",
        "",
        "| figure | before runs | after runs | after / before (medians) | within the spread | "
        "no worse than the worst before run |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    for _, key in HANDOFF:
        b = [r["handoff"][key] for r in before]
        a = [r["handoff"][key] for r in after]
        mid = statistics.median(a)
        within = min(b) <= mid <= max(b)
        lines.append(
            f"| {key} | {', '.join(f'{x:.1f}' for x in b)} | {', '.join(f'{x:.1f}' for x in a)} | "
            f"{mid / statistics.median(b):.2f} | {'yes' if within else 'no'} | {'yes' if mid <= max(b) else 'no'} |"
        )
    lines += [
        "",
        f"Ratios whose after median is no worse than the worst before run: {sum(verdicts)} of {len(verdicts)}. "
        "At this size a ratio swings with one run (plain vLLM at 2 req/s often sends a response in a burst, "
        "which its TPOT reads near 0): read the per-run columns, not one figure.",
    ]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit to compare against")
    ap.add_argument("--after", default="HEAD", help="the commit measured (default HEAD; commit your changes)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=60)
    ap.add_argument("--single-prompts", type=int, default=15)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="vllm_bench_two_commits")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the runs the pairs left in the scratch worktrees (give their arguments)",
    )
    args = ap.parse_args()
    facts = run_facts()
    facts["command"] = facts["command"].replace(" --report-only", "")  # the command that ran the pairs
    commits = {"before": resolve(args.before), "after": resolve(args.after)}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for i in range(args.pairs):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for side in order:
            name = f"before_after_{side}_{i}"
            ran = read_side(commits[side], name) if args.report_only else run_side(commits[side], name, args)
            runs[side].append(ran)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"args": vars(args), "facts": facts, "runs": runs}, indent=1))
    lines = report(runs, args, facts)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
