"""AccelGen §3.2/§6 on this machine: TTFT-SLO attainment with heterogeneous SLOs, FCFS vs AccelGen's
remaining-time order and SLO-guaranteed dynamic chunking (and SOLA's predicted-TTFT order), plus each
policy's scheduling overhead as a share of iteration time.

    python benchmarks/prefill_slo.py --num-prompts 200 --load 0.9 --rounds 3

SLOs as AccelGen sets them: prompts are grouped by length (``--group-tokens``;
AccelGen uses 512 for prompts up to 100K tokens), the group's mean prefill
latency is measured in a calibration run (FCFS, same arrivals, no SLOs), and
each request's TTFT SLO is that mean × U[0.5, 1.5]. Arrivals are Poisson at
``--load`` × the prefill capacity measured on a burst. The cost profile
(``--cost-profile``, default ``benchmarks/results/cost_profile.json`` from ``python benchmarks/cost_profile.py``)
gives the fixed ChunkSize and AccelGen's S_pf and T̄_pf. Writes benchmarks/results/prefill_slo.{md,json,png};
a progress bar counts the runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict
from typing import Any

from bench_results import provenance, run_facts
from prefill_harness import COST_PROFILE, RESULTS, Item, PrefillBench, RunResult, bench_overrides, sharegpt_prompts

MAX_PROMPT = 1024


def configs(chunk: int) -> dict[str, dict[str, Any]]:
    fixed = {"chunking": "fixed", "chunk_size": chunk}
    return {
        "fcfs + fixed": {"queue": "fcfs", **fixed},
        "accelgen order + fixed": {"queue": "accelgen", **fixed},
        "accelgen order + dynamic": {"queue": "accelgen", "chunking": "dynamic", "selection": "in-order"},
        "accelgen + dynamic + multi-resource": {
            "queue": "accelgen",
            "chunking": "dynamic",
            "selection": "multi-resource",
        },
        "sola order + fixed": {"queue": "sola", **fixed},
        "fcfs + unchunked (control)": {"queue": "fcfs", "chunking": "none"},
    }


def poisson(prompts: list[tuple[int, ...]], rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in prompts:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--load", type=float, default=0.9, help="offered prompt tokens / measured capacity")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group-tokens", type=int, default=128)
    ap.add_argument("--sched-batch", type=int, default=64)
    ap.add_argument("--cost-profile", default=str(COST_PROFILE))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    facts = run_facts()

    bench = PrefillBench(bench_overrides(8192, args.cost_profile, **{"prefill.sched_batch": args.sched_batch}))
    if bench.worker.cost is None:
        raise SystemExit("this benchmark needs a cost profile: run python benchmarks/cost_profile.py first")
    chunk = bench.worker.cost.pivot_tokens
    cfgs = configs(chunk)
    prompts = sharegpt_prompts(args.num_prompts, args.seed, bench.model, MAX_PROMPT)

    # capacity on a burst (after a warm-up of every chunking mode), then the calibration run
    for name in ("accelgen order + dynamic", "fcfs + fixed"):
        bench.set_policy(cfgs[name])
        burst = bench.run([Item(p, 0.0) for p in prompts])
    capacity = sum(map(len, prompts)) / max(o.ttft_s for o in burst.outcomes)
    rate = args.load * capacity / statistics.mean(map(len, prompts))
    arrivals = poisson(prompts, rate, args.seed)
    calib = bench.run([Item(p, t) for p, t in zip(prompts, arrivals, strict=True)])
    groups: dict[int, list[float]] = defaultdict(list)
    for o in calib.outcomes:
        groups[o.prompt_len // args.group_tokens].append(o.ttft_s)
    rng = random.Random(args.seed + 1)
    slos = [statistics.mean(groups[len(p) // args.group_tokens]) * 1e3 * rng.uniform(0.5, 1.5) for p in prompts]
    items = [Item(p, t, s) for p, t, s in zip(prompts, arrivals, slos, strict=True)]

    runs = bench.compare(cfgs, items, args.rounds, "SLO attainment")
    write_report(runs, args, chunk, capacity, rate, prompts, bench, facts)
    return 0


def med(results: list[RunResult], fn: Any) -> float:
    return statistics.median(fn(r) for r in results)


def write_report(
    runs: dict[str, list[RunResult]],
    args: argparse.Namespace,
    chunk: int,
    capacity: float,
    rate: float,
    prompts: list[tuple[int, ...]],
    bench: PrefillBench,
    facts: dict[str, str],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cost = bench.worker.cost
    assert cost is not None
    base = med(runs["fcfs + fixed"], RunResult.attainment)
    lines = [
        "# TTFT-SLO attainment with heterogeneous SLOs (AccelGen §3.2 setting) and scheduling overhead",
        "",
        *provenance(facts),
        "",
        f"{len(prompts)} ShareGPT prompts (seed {args.seed}, mean {statistics.mean(map(len, prompts)):.0f} tokens), "
        f"Poisson arrivals at {rate:.1f} req/s = {args.load} × the measured capacity of {capacity:.0f} prompt "
        f"tokens/s; one prefill worker (tiny model, CPU, 1 engine thread), PrefillSchedBatch {args.sched_batch}. "
        f"TTFT SLO = mean TTFT of the request's {args.group_tokens}-token length group in an FCFS calibration run "
        f"× U[0.5, 1.5]. Cost profile: S_pf = {cost.pivot_tokens} tokens, T̄_pf = {cost.pivot_seconds * 1e3:.2f} ms; "
        f"fixed ChunkSize = S_pf = {chunk}. Median over {args.rounds} rounds, all on one warm engine.",
        "",
        "| policy | SLO attainment | vs FCFS | mean TTFT (ms) | scheduler overhead / iteration | "
        "overhead per iteration (µs) | iterations |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, res in runs.items():
        att = med(res, RunResult.attainment)
        ovh = med(res, lambda r: r.overhead_share)
        per_it = med(res, lambda r: r.overhead_s / max(1, r.iterations) * 1e6)
        ttft = med(res, lambda r: r.mean("ttft_s")) * 1e3
        lines.append(
            f"| {name} | {100 * att:.1f}% | {100 * (att / base - 1):+.1f}% | {ttft:.1f} "
            f"| {100 * ovh:.2f}% | {per_it:.0f} | {med(res, lambda r: r.iterations):.0f} |"
        )
    fit = runs["fcfs + fixed"][-1].fit_error
    lines += [
        "",
        "AccelGen reports +37–90% SLO attainment over its baselines; SOLA reports 0.40–0.45% scheduling overhead, "
        "AccelGen 0.02% of JCT. The unchunked FCFS row is a control: it shows how much of dynamic chunking's gain "
        "comes from larger iterations alone on this machine.",
        f"Online cost-model error (SOLA eq. 3 with the eq. 5 correction, mean |pred − meas| / meas over every "
        f"iteration of this benchmark): {100 * fit:.1f}%."
        if fit is not None
        else "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prefill_slo.md").write_text("\n".join(lines) + "\n")
    data = {
        **facts,
        "args": vars(args),
        "chunk_size": chunk,
        "capacity_tokens_per_s": capacity,
        "rate_rps": rate,
        "runs": {n: [r.summary() for r in rs] for n, rs in runs.items()},
    }
    (RESULTS / "prefill_slo.json").write_text(json.dumps(data, indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(runs)
    ax.bar(range(len(names)), [100 * med(runs[n], RunResult.attainment) for n in names])
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("TTFT SLO attainment (%)")
    ax.set_title("Heterogeneous TTFT SLOs on one prefill worker")
    fig.tight_layout()
    fig.savefig(RESULTS / "prefill_slo.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
