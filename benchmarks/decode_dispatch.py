"""Dispatch across real decode engines side by side (TetriInfer Fig. 19, SCLS Fig. 17).

    python benchmarks/decode_dispatch.py          # ~25 min on 2 cores; writes results/decode_dispatch.{md,json}
    python benchmarks/decode_dispatch.py --engines 2 4 --estimates oracle --heavy 345 \
        --out benchmarks/results/decode_dispatch_oracle

Each run sends ``--per-worker`` ShareGPT requests per decode engine, in one burst, through the dispatch
policy the prefill worker uses (``prefill_worker/dispatch``), with the trained predictor's estimates or the
oracle's (``--estimates``). The
dispatcher sees each engine's load as the cluster monitor reports it (free KV, running and queued counts,
heavy/light counts, predicted remaining tokens) and accounts each dispatch locally until the next report
(``dispatch.base.account``), as a prefill worker between broadcasts does.

The engines live in this process and are stepped in turn on one thread, so each engine's *busy time*
(the sum of its own step times) is what it would take alone on its own core; with every request arriving
at the start, an engine's completion time is its busy time when its last request finishes, and the run's
total decode time is the latest of those. This is how the 2-core machine runs 2–4 decode engines without
them contending for cores.

1. Fig. 19: total decode time and the heavy/light counts on the slowest engine, for power-of-two, random
   and imbalance (heavy decodes always to the same engines), with 2, 3 and 4 engines.
2. Fig. 17: the standard deviation of the engines' completion times, round-robin vs max-min (SCLS §4.5:
   least predicted remaining work), with 4 engines.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_harness import (
    RESULTS,
    EngineRun,
    Job,
    add,
    bench_header,
    header_lines,
    load_jobs,
    make_engine,
    scheduler,
    workload_args,
    write_results,
)


def engine_load(wid: str, engine: Any, heavy: int, light: int) -> Any:
    from tetriserve.common.load import DecodeLoad

    sched = scheduler(engine)
    pool = sched.kv_cache_manager.block_pool
    return DecodeLoad(
        wid,
        pool.get_num_free_blocks(),
        pool.num_gpu_blocks,
        sched.block_size,
        len(sched.running),
        len(sched.waiting) + len(sched.kv_holding_waiting),
        heavy,
        light,
        time.time(),
        True,
        sched.remaining_tokens(),
    )


def run(
    engines: dict[str, Any],
    jobs: list[Job],
    policy: str,
    seed: int,
    heavy_threshold: int,
    max_out: int,
    source: str = "trained",
) -> dict[str, Any]:
    from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
    from tetriserve.prefill_worker.dispatch.base import account
    from tetriserve.prefill_worker.views import ReqView

    rng = random.Random(seed)
    dispatcher = make_dispatch_policy(policy, DispatchParams(heavy_threshold))
    loads = {w: engine_load(w, e, 0, 0) for w, e in engines.items()}
    placed: dict[str, list[Job]] = {w: [] for w in engines}
    start = time.perf_counter()
    for i, job in enumerate(jobs):
        view = ReqView(job.rid, len(job.prompt), max_out, float(i), estimate=job.estimates[source])
        wid = dispatcher.choose(view, list(loads.values()), rng)
        assert wid is not None
        add(engines[wid], job, source, f"{policy}-{len(engines)}", max_out)
        placed[wid].append(job)
        loads[wid] = account(loads[wid], view, heavy_threshold)
    runs = {w: EngineRun() for w in engines}
    while any(e.has_unfinished_requests() for e in engines.values()):
        for w, e in engines.items():
            if e.has_unfinished_requests():
                runs[w].step(e, start)
    workers = []
    for w in engines:
        est = [j.estimates[source] for j in placed[w]]
        heavy = sum(e.is_heavy(heavy_threshold) for e in est)
        true_heavy = sum(j.truth >= heavy_threshold for j in placed[w])
        workers.append(
            {
                "worker": w,
                "requests": len(placed[w]),
                "heavy": heavy,
                "light": len(placed[w]) - heavy,
                "true_heavy": true_heavy,
                "tokens": sum(j.truth for j in placed[w]),
                "busy_s": runs[w].busy_s,
                "steps": runs[w].steps,
            }
        )
    slowest = max(workers, key=lambda x: x["busy_s"])
    busy = [x["busy_s"] for x in workers]
    return {
        "policy": policy,
        "engines": len(engines),
        "total_decode_s": max(busy),
        "completion_std_s": statistics.pstdev(busy),
        "slowest": slowest,
        "workers": workers,
    }


def rounds(
    args: argparse.Namespace, policies: tuple[str, ...], engines: dict[str, Any], jobs: list[Job], key: str
) -> list[dict[str, Any]]:
    """``args.rounds`` rounds, the policies' order rotated each round; per policy, the round of median ``key``
    (this VM's speed drifts by tens of percent between minutes, so one run per policy is not a comparison)."""
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for r in range(args.rounds):
        for policy in policies[r % len(policies) :] + policies[: r % len(policies)]:
            out = run(engines, jobs, policy, args.seed, args.heavy, args.max_out, args.estimates)
            runs[policy].append(out)
            print(
                f"  round {r} {len(engines)} engines {policy:13s} total {out['total_decode_s']:.2f} s, "
                f"std {out['completion_std_s']:.2f} s",
                flush=True,
            )
    picked = []
    for policy in policies:
        ordered = sorted(runs[policy], key=lambda x: x[key])
        picked.append({**ordered[(len(ordered) - 1) // 2], "rounds": [x[key] for x in runs[policy]]})
    return picked


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# Dispatch across real decode engines",
        "",
        *header_lines(res),
        "Tiny model (float32, 1 thread per "
        f"engine), {args.per_worker} ShareGPT test-split requests per engine in one burst (prompt ≤ "
        f"{args.max_prompt} tokens, true output ≤ {args.max_out} tokens), the {args.estimates} predictor's estimates, "
        f"heavy = predicted ≥ {args.heavy} tokens, KV {args.blocks} blocks × 32 tokens per engine, greedy "
        "admission. Engines stepped in turn on one thread; times are each engine's own busy time (see the "
        f"module docstring). {args.rounds} rounds per policy, order rotated; each row is the round with the "
        "median value, and the last column lists every round's.",
        "",
        "## TetriInfer Fig. 19: total decode time, and the slowest engine's heavy/light decodes",
        "",
        "| engines | policy | total decode s | vs power-of-two | slowest: heavy | light | truly heavy | tokens "
        "| every round s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in args.engines:
        rows = [r for r in res["fig19"] if r["engines"] == n]
        p2c = next(r for r in rows if r["policy"] == "power-of-two")["total_decode_s"]
        for r in rows:
            s = r["slowest"]
            lines.append(
                f"| {n} | {r['policy']} | {r['total_decode_s']:.2f} | {r['total_decode_s'] / p2c - 1:+.1%} | "
                f"{s['heavy']} | {s['light']} | {s['true_heavy']} | {s['tokens']} | "
                + ", ".join(f"{x:.1f}" for x in r["rounds"])
                + " |"
            )
    lines += [
        "",
        f"## SCLS Fig. 17: spread of the engines' completion times ({max(args.engines)} engines)",
        "",
        "| policy | std of completion s | total decode s | per-engine busy s | every round's std s |",
        "|---|---|---|---|---|",
    ]
    for r in res["fig17"]:
        per = ", ".join(f"{w['busy_s']:.1f}" for w in r["workers"])
        every = ", ".join(f"{x:.2f}" for x in r["rounds"])
        lines.append(f"| {r['policy']} | {r['completion_std_s']:.2f} | {r['total_decode_s']:.2f} | {per} | {every} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--per-worker", type=int, default=32)
    ap.add_argument("--heavy", type=int, default=128, help="heavy decode: predicted output ≥ this many tokens")
    ap.add_argument("--estimates", choices=["trained", "oracle"], default="trained")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per policy, order rotated; the median is kept")
    workload_args(ap, blocks=160)
    ap.add_argument("--out", default=str(RESULTS / "decode_dispatch"))
    args = ap.parse_args()

    model_path, facts = bench_header()
    most = max(args.engines)
    pool = load_jobs(most * args.per_worker, args.seed, model_path, args.max_prompt, args.max_out)
    engines = {f"decode-{i}": make_engine(model_path, args.blocks) for i in range(most)}
    res: dict[str, Any] = {
        **facts,
        "fig19": [],
        "fig17": [],
    }
    for n in args.engines:
        subset = dict(list(engines.items())[:n])
        jobs = pool[: n * args.per_worker]
        res["fig19"] += rounds(args, ("power-of-two", "random", "imbalance"), subset, jobs, "total_decode_s")
    res["fig17"] = rounds(args, ("round-robin", "max-min"), engines, pool, "completion_std_s")
    write_results(Path(args.out), res, report(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
