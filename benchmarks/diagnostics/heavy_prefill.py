"""Where plain vLLM's lead on a heavy-prefill burst comes from: each system's CPU by process and thread, and
each engine's steps.

    python benchmarks/diagnostics/heavy_prefill.py --workload HPLD --variant vllm=vllm \
        --variant tetriinfer="--preset tetriinfer" --variant no_reserve="--preset tetriinfer --no-reserve-decode-cores"

Each ``--variant NAME=FLAGS`` is a fresh server: ``vllm`` (or ``vllm-nochunk``) as FLAGS is plain vLLM on one
engine thread, as ``tetriinfer_e2e.py`` starts it; anything else is ``tetriserve serve FLAGS`` on 1 prefill + 1
decode engine of one thread each (``--mode colocated`` among the flags: two engines that run both phases). On each,
``tetriinfer_e2e.py``'s warm-up requests, then one burst of ``--workload`` (seed ``--seed``'s draw, as there)
with vLLM's client. Reported per run: the burst's capacity (requests over the makespan); CPU seconds of each
process of the server's session and of the heaviest threads (by OS name: ``eng-<worker>`` is an engine's
stepping thread); for tetriserve, each engine's figures from ``/metrics`` as ``engine_steps.py`` reads them (its
share of the makespan inside steps, time per step by the wall and the CPU clock, tokens per step, ...) and its
stepping thread's wait for a core. Variants alternate from one repeat to the next. Writes
``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import command_line, run_facts
from engine_steps import engine_figures, median_row, worker_series
from tetriinfer_e2e import (
    MAX_MODEL_LEN,
    PORT,
    WARMUP,
    WORKLOADS,
    bench,
    capacity,
    draw,
    figures,
    pool,
    server,
    sharegpt_file,
)
from thread_timeline import engine_threads, threads
from vllm_bench_report import RESULTS
from vllm_bench_serve import WORK as BENCH_WORK
from vllm_bench_serve import cpu_by_process, prepare, serving, session_cpu, tetriserve_cmd

ENGINES = [
    *("--threads-per-engine", "1", "--num-prefill", "1", "--num-decode", "1"),
    *("--max-model-len", str(MAX_MODEL_LEN)),
]
TOP_THREADS = 8  # threads listed per run, by CPU seconds


def command(flags: str, model: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The server of one variant: plain vLLM for ``vllm`` / ``vllm-nochunk``, else tetriserve with ``flags``."""
    if flags.strip() in ("vllm", "vllm-nochunk"):
        return server(flags.strip(), model, env, Path())
    return tetriserve_cmd(*ENGINES, *shlex.split(flags)), env


def thread_cpu(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds by OS thread name (threads of one name summed) between two ``threads`` readings."""
    out: dict[str, float] = defaultdict(float)
    for tid, (name, stat, _) in after.items():
        out[name] += (stat[0] - before.get(tid, (name, [0], 0))[1][0]) / 1e9
    return dict(sorted(((k, round(v, 2)) for k, v in out.items() if v >= 0.05), key=lambda kv: -kv[1]))


def measure(name: str, flags: str, files: dict[str, Path], n: int, seed: int, model: str, env: dict) -> dict:
    cmd, senv = command(flags, model, env)
    with serving(cmd, senv, BENCH_WORK / f"server_heavy_{name}.log", PORT) as proc:
        bench(f"heavy_{name}", "warmup", files["warmup"], model, WARMUP, math.inf, seed)
        time.sleep(2)
        series, t0, cpu0, began = worker_series(), threads(proc.pid), session_cpu(proc.pid), time.monotonic()
        result, client_cpu = bench(f"heavy_{name}", "burst", files["burst"], model, n, math.inf, seed)
        seconds = time.monotonic() - began
        t1, cpu1 = threads(proc.pid), session_cpu(proc.pid)
        time.sleep(2)  # the last steps counted before the scrape
        series1 = worker_series()
    burst = figures(result)
    engines = engine_figures(series, series1, burst["duration_s"])
    for tid, tname in engine_threads(t1).items():
        if (worker := tname.removeprefix("eng-")) in engines and tid in t0:
            engines[worker]["runqueue_wait_s"] = (t1[tid][1][1] - t0[tid][1][1]) / 1e9
    by_process = {k: round(v * seconds, 2) for k, v in cpu_by_process(cpu0, cpu1, seconds).items()}
    return {
        "capacity": round(capacity(burst), 2),
        "makespan_s": round(burst["duration_s"], 2),
        "seconds": round(seconds, 2),
        "server_cpu_s": round(sum(by_process.values()), 2),
        "client_cpu_s": round(client_cpu, 2),
        "processes": by_process,
        "threads": dict(list(thread_cpu(t0, t1).items())[:TOP_THREADS]),
        "engines": engines,
    }


def flat(run: dict) -> dict[str, float]:
    out = {k: float(run[k]) for k in ("capacity", "makespan_s", "seconds", "server_cpu_s", "client_cpu_s")}
    out |= {f"process {k}": v for k, v in run["processes"].items()}
    out |= {f"thread {k}": v for k, v in run["threads"].items()}
    for worker, e in run["engines"].items():
        out |= {f"{worker} {k}": float(v) for k, v in e.items()}
    return out


def report(data: dict[str, Any]) -> str:
    runs = data["runs"]
    names = list(runs)
    keys = list(dict.fromkeys(k for n in names for r in runs[n] for k in flat(r)))
    lines = [
        f"# Heavy-prefill burst: CPU by process and thread, engine steps ({data['workload']})",
        "",
        f"Command: `{data['command']}`  ",
        f"Machine: {data['machine']}  ",
        f"Commit: {data['commit']}  ",
        "",
        f"One burst of {data['requests']} {data['workload']} requests (seed {data['seed']}) per run after "
        f"{WARMUP} warm-up requests; each cell the median over repeats, each repeat's value after it. CPU "
        "seconds over the burst; `eng-*` an engine's stepping thread; `ms_per_step_*` time inside engine steps per "
        "step by the wall clock and the stepping thread's CPU clock; `busy_share` the wall inside steps over the "
        "burst's makespan; `runqueue_wait_s` the seconds the stepping thread was runnable but waited for a core; "
        "`seconds` the client's whole run (its start-up included), over which CPU is counted.",
        "",
        "| figure | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    lines += [median_row(key, [[f[key] for r in runs[n] if key in (f := flat(r))] for n in names]) for key in keys]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=WORKLOADS, default="HPLD")
    ap.add_argument("--variant", action="append", required=True, help="NAME=FLAGS (or NAME=vllm)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default="heavy_prefill")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    model, _, env = prepare()
    d = draw(pool(model, args.num_prompts), [args.workload], args.num_prompts, args.seed)
    files = {"warmup": BENCH_WORK / f"heavy_warmup_s{args.seed}.json",
             "burst": BENCH_WORK / f"heavy_{args.workload}_s{args.seed}.json"}  # fmt: skip
    files["warmup"].write_text(json.dumps(sharegpt_file(d.warmup)))
    files["burst"].write_text(json.dumps(sharegpt_file(d.burst[args.workload])))
    n = len(d.burst[args.workload])
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        for name in list(variants) if rep % 2 == 0 else list(variants)[::-1]:
            run = measure(name, variants[name], files, n, args.seed, model, env)
            runs[name].append(run)
            print(f"[{rep + 1}/{args.repeats}] {name}: capacity {run['capacity']} req/s, server "
                  f"{run['server_cpu_s']} CPU-s", flush=True)  # fmt: skip
    data = {**run_facts(), "command": command_line(), "workload": args.workload, "seed": args.seed,
            "requests": n, "runs": runs}  # fmt: skip
    text = report(data)
    (RESULTS / f"{args.out}.md").write_text(text)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
