"""What waiting for the length prediction before a request queues costs in TTFT (``prefill.predictor_queue_wait_ms``).

    python benchmarks/predictor_queue_wait.py --waits 0 100 1000 --modes disaggregated colocated

The prefill queue's order may read the length estimate (AccelGen's S_g of a JCT SLO, the estimate in the
prefill gate's and engine's views). By default a request queues at once on the predictor's instant estimate and
the prediction replaces it when it is out; with a queue wait the request first waits up to that long for its
prediction. For each mode and wait, one cluster (the ``accelgen`` preset; disaggregated, one prefill and one
decode worker, or colocated, two workers; the trained predictor, in its own process as in service) replays the
same ShareGPT workload as ``paper_policies.py`` (seeded prompts and output lengths, Poisson arrivals,
per-request SLOs) and reports TTFT p50/p99, its ratio to no wait in the same mode, JCT, SLO attainment and,
disaggregated, the prefill worker's prediction counts (on time: the prediction was out when the first token
was). Writes ``benchmarks/results/predictor_queue_wait.{md,json}``; a line per run as it ends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import provenance, run_facts, write_result  # noqa: E402
from paper_policies import (  # noqa: E402
    BASE_OVERRIDES,
    add_workload_args,
    prepare,
    profile_record,
    replay,
    summarize,
    warm_up,
)

SHOWN = ("ttft_p50_ms", "ttft_p99_ms", "jct_mean_s", "attain_ttft", "attain_both", "incomplete")


def run_wait(mode: str, wait_ms: float, arrivals: list[Any], model_path: str, profile: str, tag: str) -> dict[str, Any]:
    import ray

    from tetriserve.common.config import ClusterConfig
    from tetriserve.control_plane.launcher import launch

    overrides = {
        **BASE_OVERRIDES,
        "preset": "accelgen",
        "mode": mode,
        "prefill.predictor": "trained",
        "prefill.cost_profile": profile,
        "prefill.predictor_queue_wait_ms": wait_ms,
    }
    t0 = time.monotonic()
    cluster = launch(ClusterConfig.load(overrides=overrides), model_path)
    try:
        warm_up(cluster, arrivals)
        prefill = next(iter(cluster.prefill.values()), None) if mode == "disaggregated" else None
        before = ray.get(prefill.stats.remote())["predictions"] if prefill is not None else {}
        outcomes, wall = replay(cluster, arrivals, tag, arrivals[-1].offset_s + 300)
        after = ray.get(prefill.stats.remote())["predictions"] if prefill is not None else {}
    finally:
        cluster.shutdown()
    counts = {k: int(after[k]) - int(before.get(k, 0)) for k in ("on_time", "late") if k in after}
    figures = summarize(outcomes, wall)
    return {"mode": mode, "wait_ms": wait_ms, "elapsed_s": time.monotonic() - t0, **figures, **counts}


def report(data: dict[str, Any]) -> str:
    rows = data["runs"]
    lines = [
        "# Waiting for the length prediction before queueing: its TTFT cost",
        "",
        *provenance(data),
        "",
        f"{data['workload']}. The `accelgen` preset (disaggregated: 1 prefill + 1 decode worker; colocated: 2 "
        "workers), the trained length predictor; one cluster per mode and wait, the same requests. TTFT ratio: p50 "
        "against no wait in the same mode. Predictions on time / late: the prefill worker's, at the handoff.",
        "",
        "| mode | prefill.predictor_queue_wait_ms | TTFT p50 ms | TTFT p99 ms | TTFT p50 vs 0 | mean JCT s "
        "| TTFT SLO met | both SLOs met | predictions on time / late | incomplete |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = next((b for b in rows if b["mode"] == r["mode"] and b["wait_ms"] == 0), r)
        ratio = r["ttft_p50_ms"] / base["ttft_p50_ms"] if base["ttft_p50_ms"] else float("nan")
        lines.append(
            f"| {r['mode']} | {r['wait_ms']:g} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {ratio:.2f}× | "
            f"{r['jct_mean_s']:.2f} | {100 * r['attain_ttft']:.0f}% | {100 * r['attain_both']:.0f}% | "
            f"{r.get('on_time', '-')} / {r.get('late', '-')} | {int(r['incomplete'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waits", nargs="+", type=float, default=[0.0, 100.0, 1000.0], help="waits to compare, ms")
    ap.add_argument(
        "--modes", nargs="+", choices=("disaggregated", "colocated"), default=["disaggregated", "colocated"]
    )
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--rate", type=float, default=5.0, help="Poisson arrivals per second")
    add_workload_args(ap, "predictor_queue_wait")
    args = ap.parse_args()
    facts = run_facts()
    model_path, profile, _, arrivals = prepare(args)
    outputs = statistics.mean(a.max_tokens for a in arrivals)
    workload = (
        f"{len(arrivals)} ShareGPT requests (seed {args.seed}), Poisson at {args.rate:g}/s over "
        f"{arrivals[-1].offset_s:.0f} s, mean output {outputs:.0f} tokens, SLO classes {args.slo_classes}"
    )
    runs, began = [], time.monotonic()
    plan = [(mode, wait) for mode in args.modes for wait in args.waits]
    for k, (mode, wait) in enumerate(plan, 1):
        res = run_wait(mode, wait, arrivals, model_path, profile, f"w{k}")
        runs.append(res)
        print(
            f"[{k}/{len(plan)}] {mode} wait {wait:g} ms: {res['elapsed_s']:.0f} s, TTFT p50 "
            f"{res['ttft_p50_ms']:.0f} ms, p99 {res['ttft_p99_ms']:.0f} ms; total {time.monotonic() - began:.0f} s",
            flush=True,
        )
    data = {**facts, "args": vars(args), "profile": profile_record(args, profile), "workload": workload, "runs": runs}
    return write_result(Path(args.out), data, report)


if __name__ == "__main__":
    sys.exit(main())
