"""SCLS Fig. 17 with slices, on the real cluster: completion-time spread of the decode workers.

    python benchmarks/decode_slices.py     # ~9 min on 2 cores; writes results/decode_slices.{md,json}
    python benchmarks/decode_slices.py --decode 2 --dispatch round-robin max-min imbalance \
        --out benchmarks/results/decode_slices_2

``imbalance`` (Fig. 19's worst case: every heavy decode to the same half of the workers) shows what the
rebalancing can undo when dispatch goes wrong.

One cluster per dispatch policy (``--dispatch``; round-robin and max-min by default), each 1 prefill +
``--decode`` decode workers on Ray, the tiny model, 1 thread per engine. In each, ``--rounds`` rounds of
two runs, slices off and on (order rotated each round; slices are switched with the decode workers' ``set_policy``, as
`tetriserve policy set --worker decode slice_iters=N` does). A run is one burst of ``--per-worker`` ×
``--decode`` ShareGPT requests from the predictor's test split (prompt's last ``--max-prompt`` tokens,
true answer length in the tiny model's tokens capped at ``--max-out``), greedy with ``ignore_eos`` and
``max_tokens`` = the true length. The prefill worker's predictor is the oracle (true lengths), so the
estimates that dispatch and the slice rebalancer read are exact; ``max_tokens`` is the true length
anyway, so no other predictor could be measured without it leaking in.

A worker's completion time is when the last request that *finished on it* finished, from the burst's
start; the spread is their standard deviation. All engines share the 2 cores, so these are wall-clock
times under contention (a worker that goes idle leaves its core to the others); which worker each
request finished on comes from the GlobalScheduler's request records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_harness import (
    RESULTS,
    Job,
    bench_header,
    header_lines,
    load_jobs,
    median,
    workload_args,
    write_results,
)


def launch(args: argparse.Namespace, model_path: str, dispatch: str, workload: Path) -> Any:
    from tetriserve.common.config import ClusterConfig
    from tetriserve.control_plane.launcher import launch as launch_cluster

    overrides = {
        "num_decode": args.decode,
        "engine.dtype": "float32",
        "engine.enforce_eager": True,
        "engine.max_model_len": 1024,
        "engine.kv_cache_gb": args.kv_cache_gb,
        "prefill.chunk_size": 512,
        "prefill.dispatch_policy": dispatch,
        "prefill.predictor": "oracle",
        "prefill.predictor_workload": str(workload),
        "decode.slice_min_interval_s": args.gamma,
        "decode.slice_min_interval_iters": 0,  # Γ in seconds: --gamma
        "decode.slice_lambda": args.lam,
        "grpc_port": 0,
        "http_port": 0,
        "namespace": f"tetriserve-bench-{dispatch}",
    }
    return launch_cluster(ClusterConfig.load(overrides=overrides), model_path)


def burst(cluster: Any, jobs: list[Job], tag: str) -> dict[str, Any]:
    import ray

    from tetriserve.common.request import Request, SamplingSpec
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")
    moved_before = ray.get(cluster.scheduler.status.remote())["counts"]["moved"]

    async def run_all() -> dict[str, float]:
        start = time.perf_counter()

        async def one(job: Job) -> float:
            spec = SamplingSpec(max_tokens=job.truth, temperature=0.0, ignore_eos=True)
            async for chunk in backend.generate(Request(f"{job.rid}-{tag}", job.prompt, spec)):
                assert chunk.finish_reason in (None, "length"), chunk.error
            return time.perf_counter() - start

        try:
            done = await asyncio.gather(*(one(j) for j in jobs))
        finally:
            backend.close()
        return {f"{j.rid}-{tag}": t for j, t in zip(jobs, done, strict=True)}

    finished_at = asyncio.run(run_all())
    records = ray.get(cluster.scheduler.recent.remote(len(jobs)))
    where = {r.request_id: r.decode_worker for r in records if r.request_id in finished_at}
    assert len(where) == len(jobs), "the scheduler's history must hold the whole burst"
    workers = {}
    for wid in sorted(cluster.decode):
        mine = [finished_at[rid] for rid, w in where.items() if w == wid]
        workers[wid] = {"finished": len(mine), "completion_s": max(mine, default=0.0)}
    completion = [w["completion_s"] for w in workers.values()]
    return {
        "completion_std_s": statistics.pstdev(completion),
        "total_s": max(completion),
        "mean_jct_s": statistics.fmean(finished_at.values()),
        "moves": ray.get(cluster.scheduler.status.remote())["counts"]["moved"] - moved_before,
        "workers": workers,
    }


def set_slices(cluster: Any, slice_iters: int) -> None:
    import ray

    ray.get([h.set_policy.remote({"slice_iters": slice_iters}) for h in cluster.decode.values()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_args(ap)
    ap.add_argument("--decode", type=int, default=4, help="decode workers")
    ap.add_argument("--per-worker", type=int, default=32)
    ap.add_argument("--slice-iters", type=int, default=32, help="S")
    ap.add_argument("--gamma", type=float, default=0.5, help="eq. 12 Γ, seconds")
    ap.add_argument("--lam", type=float, default=0.5, help="eq. 12 λ")
    ap.add_argument("--kv-cache-gb", type=float, default=0.5, help="KV cache per decode engine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--dispatch", nargs="+", default=["round-robin", "max-min"], help="dispatch policies, one cluster each"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "decode_slices")
    args = ap.parse_args()

    model_path, facts = bench_header()
    jobs = load_jobs(args.decode * args.per_worker, args.seed, model_path, args.max_prompt, args.max_out)
    res: dict[str, Any] = {**facts, "args": vars(args) | {"out": str(args.out)}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(tmp) / "oracle.jsonl"
        workload.write_text(
            "".join(json.dumps({"prompt_token_ids": list(j.prompt), "response_len": j.truth}) + "\n" for j in jobs)
        )
        for dispatch in args.dispatch:
            cluster = launch(args, model_path, dispatch, workload)
            try:
                configs = (("off", 0), ("on", args.slice_iters))
                for r in range(args.rounds):
                    for name, s in configs[r % 2 :] + configs[: r % 2]:
                        set_slices(cluster, s)
                        out = burst(cluster, jobs, f"{dispatch}-{name}-{r}")
                        res["runs"].setdefault(f"{dispatch} / slices {name}", []).append(out)
                        print(
                            f"round {r} {dispatch:11s} slices {name:3s}: std {out['completion_std_s']:.2f} s, "
                            f"total {out['total_s']:.1f} s, mean JCT {out['mean_jct_s']:.1f} s, "
                            f"{out['moves']} moves",
                            flush=True,
                        )
            finally:
                cluster.shutdown()
    rows = []
    for name, runs in res["runs"].items():
        rows.append(
            f"| {name} | {median([x['completion_std_s'] for x in runs]):.2f} | "
            f"{median([x['total_s'] for x in runs]):.1f} | {median([x['mean_jct_s'] for x in runs]):.1f} | "
            f"{median([x['moves'] for x in runs]):.0f} |"
        )
    md = (
        f"# SCLS Fig. 17 with slices (real cluster, {args.decode} decode workers × {args.per_worker} requests)\n\n"
        + "\n".join(header_lines(facts))
        + "\n\n"
        f"All engines share the machine's cores; S = {args.slice_iters}, "
        f"Γ = {args.gamma} s, λ = {args.lam}; oracle estimates; medians of {args.rounds} rotated rounds.\n\n"
        "| dispatch / slices | completion std (s) | total (s) | mean JCT (s) | moves |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    write_results(args.out, res, md)


if __name__ == "__main__":
    main()
