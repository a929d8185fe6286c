"""TetriInfer Fig. 16 on this machine: prefill waiting time and TTFT for FCFS / SJF / LJF at PrefillSchedBatch
16 and 128 on a ShareGPT burst, and chunked vs unchunked prefill.

    python benchmarks/prefill_policies.py --num-prompts 128 --rounds 3

One prefill worker (benchmarks/prefill_harness.py) serves every configuration
on the same warm engine; each round runs every configuration once, in a
rotated order, and the table reports the median over rounds of each run's
mean. ChunkSize defaults to the pivot of the cost profile ``benchmarks/results/cost_profile.json``
(``python benchmarks/cost_profile.py``). Writes benchmarks/results/prefill_policies.{md,json,png}; a
progress bar counts the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench_results import provenance, run_facts
from prefill_harness import COST_PROFILE, RESULTS, Item, PrefillBench, RunResult, bench_overrides, sharegpt_prompts

MAX_PROMPT = 1024


def configs(chunk: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for sb in (16, 128):
        for q in ("fcfs", "sjf", "ljf"):
            out[f"{q} b{sb}"] = {"queue": q, "sched_batch": sb, "chunking": "fixed", "chunk_size": chunk}
    out["fcfs b16 unchunked"] = {"queue": "fcfs", "sched_batch": 16, "chunking": "none", "chunk_size": chunk}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-size", type=int, default=None, help="ChunkSize (default: the cost profile's pivot)")
    ap.add_argument("--cost-profile", default=str(COST_PROFILE))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    facts = run_facts()

    bench = PrefillBench(bench_overrides(16 * MAX_PROMPT, args.cost_profile))
    chunk = args.chunk_size or (bench.worker.cost.pivot_tokens if bench.worker.cost else 512)
    prompts = sharegpt_prompts(args.num_prompts, args.seed, bench.model, MAX_PROMPT)
    burst = [Item(p, 0.0) for p in prompts]
    cfgs = configs(chunk)
    for warm in ("fcfs b128", "fcfs b16 unchunked"):  # compile every shape the runs will use before timing
        bench.set_policy(cfgs[warm])
        bench.run(burst)
    runs = bench.compare(cfgs, burst, args.rounds, "prefill policies")
    write_report(runs, args, chunk, prompts, facts)
    return 0


def med(results: list[RunResult], attr: str) -> float:
    return statistics.median(r.mean(attr) for r in results)


def write_report(
    runs: dict[str, list[RunResult]], args: argparse.Namespace, chunk: int, prompts: list[Any], facts: dict[str, str]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lens = [len(p) for p in prompts]
    lines = [
        "# Prefill policies: TetriInfer Fig. 16 on this machine",
        "",
        *provenance(facts),
        "",
        f"A burst of {len(prompts)} ShareGPT first-turn prompts (seed {args.seed}; {min(lens)}–{max(lens)} tokens, "
        f"mean {statistics.mean(lens):.0f}, truncated at {MAX_PROMPT}) arrives at once at one prefill worker "
        f"(tiny model, CPU, 1 engine thread). ChunkSize {chunk} (the cost profile's pivot). Each cell: median over "
        f"{args.rounds} rounds of the run's mean; all configurations share one warm engine.",
        "",
        "| configuration | mean prefill wait (ms) | mean TTFT (ms) | wait vs FCFS, same batch "
        "| TTFT vs FCFS, same batch |",
        "|---|---|---|---|---|",
    ]
    for name, res in runs.items():
        base = runs["fcfs b16" if "b16" in name else "fcfs b128"]
        w, t = med(res, "wait_s"), med(res, "ttft_s")
        bw, bt = med(base, "wait_s"), med(base, "ttft_s")
        lines.append(
            f"| {name} | {w * 1e3:.1f} | {t * 1e3:.1f} | {100 * (w / bw - 1):+.1f}% | {100 * (t / bt - 1):+.1f}% |"
        )
    un, ch = runs["fcfs b16 unchunked"], runs["fcfs b16"]
    sjf16, sjf128 = med(runs["sjf b16"], "ttft_s"), med(runs["sjf b128"], "ttft_s")
    w16 = med(runs["sjf b16"], "wait_s") / med(runs["fcfs b16"], "wait_s") - 1
    w128 = med(runs["sjf b128"], "wait_s") / med(runs["fcfs b128"], "wait_s") - 1
    lines += [
        "",
        f"- SJF vs FCFS waiting time, batch 16: {100 * w16:+.1f}% (TetriInfer: −7.8%); batch 128: {100 * w128:+.1f}%.",
        f"- SJF TTFT, batch 128 vs 16: {100 * (sjf128 / sjf16 - 1):+.1f}% (TetriInfer: −46.5%).",
        f"- Chunked vs unchunked FCFS, mean TTFT: {100 * (med(ch, 'ttft_s') / med(un, 'ttft_s') - 1):+.1f}% "
        "(TetriInfer: −86.4% prefill latency).",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prefill_policies.md").write_text("\n".join(lines) + "\n")
    data = {
        **facts,
        "args": vars(args),
        "chunk_size": chunk,
        "runs": {n: [r.summary() for r in rs] for n, rs in runs.items()},
    }
    (RESULTS / "prefill_policies.json").write_text(json.dumps(data, indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(runs)
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [med(runs[n], "wait_s") * 1e3 for n in names], 0.4, label="mean prefill wait")
    ax.bar([i + 0.2 for i in x], [med(runs[n], "ttft_s") * 1e3 for n in names], 0.4, label="mean TTFT")
    ax.set_xticks(list(x), names, rotation=20)
    ax.set_ylabel("ms")
    ax.set_title("Prefill queue policies on a ShareGPT burst (TetriInfer Fig. 16)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "prefill_policies.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
