"""Decode workers killed under load: how many requests fail, and what the kills cost.

Two runs on this machine, same data, same seed, each on a fresh `tetriserve serve` with 2 prefill + 2
decode workers, vLLM's own benchmark client at Poisson --request-rate against the HTTP front door:

    undisturbed   nothing is killed
    kills         every --kill-every seconds a serving decode worker is killed with ``ray.kill`` for as long as
                  the client runs, alternating decode-0, decode-1, ... (the other one when the next in turn is
                  still restarting; none when neither serves); the supervisor re-creates each one

    python benchmarks/failure_kills.py --num-prompts 360 --request-rate 2 --kill-every 30 --seed 0

A request is "in flight at a kill" when the kill falls between its start and its end (the client's
``start_times`` and the kill times are both ``time.perf_counter()``, one clock on Linux). Writes
``benchmarks/results/failure_kills.{md,json}``; the benchmark client shows each run's progress, and each kill
prints a line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import provenance, run_facts
from vllm_bench_report import RESULTS, WORK, saved
from vllm_bench_serve import prepare, run_bench, stop, tetriserve_cmd, wait_ready

PORT = 8100
NAMESPACE = "tetriserve"


def killer(every_s: float, done: threading.Event, kills: list[tuple[float, str]], skipped: list[float]) -> None:
    """Every ``every_s`` until ``done``, kill the serving decode worker next in turn (or the other one); note
    (perf_counter, victim) of each kill and the times no decode worker was serving to be killed."""
    import ray

    ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    try:
        turn = 0
        while not done.wait(every_s):
            serving = {w for w, v in worker_restarts().items() if v["state"] == "active" and w.startswith("decode")}
            order = [f"decode-{turn % 2}", f"decode-{(turn + 1) % 2}"]
            victim = next((w for w in order if w in serving), None)
            if victim is None:
                skipped.append(time.perf_counter())
                print("[kills] no decode worker is serving: nothing to kill", flush=True)
                continue
            ray.kill(ray.get_actor(victim, namespace=NAMESPACE))
            kills.append((time.perf_counter(), victim))
            print(f"[kills] killed {victim}", flush=True)
            turn = int(victim[-1]) + 1
    finally:
        ray.shutdown()


def worker_restarts() -> dict[str, dict[str, Any]]:
    from tetriserve.client import TetriServeClient

    with TetriServeClient("127.0.0.1:50151", timeout=30) as client:
        st = client.cluster_status()
    return {w.worker_id: {"state": w.state, "incarnation": w.incarnation, "restarts": w.restarts} for w in st.workers}


def one_run(name: str, args: argparse.Namespace, model: str, dataset: Path, env: dict[str, str]) -> dict[str, Any]:
    cmd = tetriserve_cmd("--num-prefill", "2", "--num-decode", "2")
    kills: list[tuple[float, str]] = []
    skipped: list[float] = []
    with open(WORK / f"server_failures_{name}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=WORK.parent.parent, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_ready(f"http://127.0.0.1:{PORT}", proc)
            run_bench(f"failures_{name}", "warmup", PORT, args, model, dataset)
            done = threading.Event()
            thread = threading.Thread(target=killer, args=(args.kill_every, done, kills, skipped), daemon=True)
            if name == "kills":
                thread.start()
            try:
                run_bench(f"failures_{name}", "rate", PORT, args, model, dataset)
            finally:
                done.set()
                if thread.is_alive():
                    thread.join(30)
            workers = worker_restarts()
        finally:
            stop(proc)
    return {"kills": kills, "skipped": skipped, "workers": workers, "detail": saved(f"failures_{name}", "rate")}


def per_request(detail: dict[str, Any]) -> list[dict[str, float]]:
    rows = []
    for start, ttft, latency, n, err in zip(
        detail["start_times"],
        detail["ttfts"],
        detail["latencies"],
        detail["output_lens"],
        detail["errors"],
        strict=True,
    ):
        ok = not err
        tpot = (latency - ttft) / (n - 1) if ok and n > 1 else float("nan")
        rows.append({"start": start, "end": start + latency, "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "ok": ok})
    return rows


def stats(rows: list[dict[str, float]]) -> dict[str, float]:
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok]
    tpot = [r["tpot_ms"] for r in ok if r["tpot_ms"] == r["tpot_ms"]]

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))

    return {
        "requests": len(rows),
        "failed": len(rows) - len(ok),
        "median_ttft_ms": statistics.median(ttft) if ttft else float("nan"),
        "p90_ttft_ms": q(ttft, 90),
        "max_ttft_ms": max(ttft, default=float("nan")),
        "median_tpot_ms": statistics.median(tpot) if tpot else float("nan"),
        "p90_tpot_ms": q(tpot, 90),
        "max_tpot_ms": max(tpot, default=float("nan")),
    }


def report(runs: dict[str, dict[str, Any]], args: argparse.Namespace, facts: dict[str, str]) -> str:
    base = per_request(runs["undisturbed"]["detail"])
    hit = per_request(runs["kills"]["detail"])
    kill_times = [t for t, _ in runs["kills"]["kills"]]
    at_kill = [r for r in hit if any(r["start"] <= k <= r["end"] for k in kill_times)]
    clear = [r for r in hit if not any(r["start"] <= k <= r["end"] for k in kill_times)]
    groups = {
        "undisturbed run, all": stats(base),
        "kills run, all": stats(hit),
        "kills run, in flight at a kill": stats(at_kill),
        "kills run, no kill while in flight": stats(clear),
    }
    t0 = min(r["start"] for r in hit)
    lines = [
        "# Decode workers killed under load",
        "",
        *provenance(facts),
        "Client: `vllm.benchmarks.serve --backend openai --dataset-name sharegpt` at Poisson arrivals; each run on a "
        "fresh `tetriserve serve --num-prefill 2 --num-decode 2` (tiny random-weight Llama, 1 OMP thread per "
        "engine, no GPU), warmed up with 64 prompts first (not measured).  ",
        "Kills: " + ", ".join(f"{victim} at {t - t0:.0f} s" for t, victim in runs["kills"]["kills"]) + ".  ",
        "No decode worker serving (nothing killed) at: "
        + (", ".join(f"{t - t0:.0f} s" for t in runs["kills"]["skipped"]) or "never")
        + ".  ",
        "Workers after the kills run: "
        + ", ".join(f"{w} life {v['incarnation']} ({v['state']})" for w, v in sorted(runs["kills"]["workers"].items()))
        + ".",
        "",
        "| requests | n | failed | median TTFT ms | p90 TTFT ms | max TTFT ms | median TPOT ms | p90 TPOT ms "
        "| max TPOT ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, s in groups.items():
        lines.append(
            f"| {label} | {s['requests']} | {s['failed']} | {s['median_ttft_ms']:.0f} | {s['p90_ttft_ms']:.0f} | "
            f"{s['max_ttft_ms']:.0f} | {s['median_tpot_ms']:.1f} | {s['p90_tpot_ms']:.1f} | {s['max_tpot_ms']:.1f} |"
        )
    errors = sorted({e for e in runs["kills"]["detail"]["errors"] if e})
    if errors:
        lines += ["", "Errors the client saw: " + "; ".join(e[:200] for e in errors)]
    (RESULTS / "failure_kills.json").write_text(
        json.dumps(
            {
                **facts,
                "args": vars(args),
                "groups": groups,
                "kills": runs["kills"]["kills"],
                "workers": runs["kills"]["workers"],
            },
            indent=2,
        )
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=360, help="prompts per run (360 at 2 req/s: 3 minutes)")
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    facts = run_facts()
    model, dataset, env = prepare()
    runs = {}
    for i, name in enumerate(("undisturbed", "kills"), 1):
        print(f"== [{i}/2] {name} run", flush=True)
        runs[name] = one_run(name, args, model, dataset, env)
    text = report(runs, args, facts)
    (RESULTS / "failure_kills.md").write_text(text)
    print(text)
    failed = sum(1 for e in runs["kills"]["detail"]["errors"] if e)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
