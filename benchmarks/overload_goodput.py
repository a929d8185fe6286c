"""Goodput and refusals against offered load, with the admission bound and without it.

Two runs on this machine, same requests, same arrival times, each on a fresh `tetriserve serve`:

    bounded     the defaults: admitted only if expected to start within admission.max_wait_s (30 s), at the front
                door's gate and at the prefill worker it is placed on
    unbounded   every bound opened wide (max_wait_s, min_queue, max_inflight, max_queued_per_worker all huge):
                everything is admitted

First the service's capacity is measured on the bounded run: a closed loop of --concurrency clients (enough to
fill the decode batch), completed requests per second after a warm-up. Then both runs get Poisson arrivals at
--loads × that capacity for --duration seconds each, in the same order. Every client waits at most --deadline
seconds for its answer (as a user who gives up), then hangs up (which aborts the request). Per load:

    goodput    requests answered 200 within the deadline, per second of offered load
    refused    the share answered 429 (and how fast: the median and p99 seconds to the refusal)
    timed out  the share whose client gave up

    python benchmarks/overload_goodput.py --loads 0.5 1 2 3 5 --duration 60 --deadline 60 --seed 0

Writes ``benchmarks/results/overload_goodput.{md,json,png}``; a line per step (capacity, each load) as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import provenance, run_facts
from vllm_bench_report import RESULTS, WORK
from vllm_bench_serve import prepare, stop, tetriserve_cmd, wait_ready

URL = "http://127.0.0.1:8100"
UNBOUNDED = (
    "admission:\n  max_wait_s: 1.0e9\n  min_queue: 1000000000\n  max_inflight: 1000000000\n"
    "  max_queued_per_worker: 1000000000\n"
)


def prompt(i: int) -> str:
    return f"Request {i}: tell me a long story about the sea, the ships and the people who sail them. " * 3


async def one(client: httpx.AsyncClient, i: int, max_tokens: int, deadline_s: float) -> dict[str, Any]:
    body = {"model": "tiny-llama", "prompt": prompt(i), "max_tokens": max_tokens, "ignore_eos": True}
    t0 = time.monotonic()
    try:
        r = await asyncio.wait_for(client.post(f"{URL}/v1/completions", json=body), deadline_s)
        return {"status": r.status_code, "s": time.monotonic() - t0}
    except TimeoutError:
        return {"status": "timeout", "s": deadline_s}
    except httpx.HTTPError as exc:
        return {"status": type(exc).__name__, "s": time.monotonic() - t0}


def client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=20000, max_keepalive_connections=512)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=30))


async def capacity(concurrency: int, warmup_s: float, measure_s: float, max_tokens: int) -> float:
    """Completed requests per second of a closed loop of ``concurrency`` clients, after ``warmup_s``."""
    done: list[float] = []
    stop_at = time.monotonic() + warmup_s + measure_s

    async def loop(worker: int, c: httpx.AsyncClient) -> None:
        i = worker
        while time.monotonic() < stop_at:
            out = await one(c, i, max_tokens, 300)
            if out["status"] == 200:
                done.append(time.monotonic())
            i += concurrency

    async with client() as c:
        t0 = time.monotonic()
        await asyncio.gather(*(loop(w, c) for w in range(concurrency)))
    start = t0 + warmup_s
    return sum(1 for t in done if start <= t <= start + measure_s) / measure_s


async def offered(rate: float, duration_s: float, deadline_s: float, max_tokens: int, seed: int) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` for ``duration_s``; every request's outcome."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(rate)
    while t < duration_s:
        arrivals.append(t)
        t += rng.expovariate(rate)
    async with client() as c:
        t0 = time.monotonic()

        async def at(i: int, when: float) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + when - time.monotonic()))
            return await one(c, i, max_tokens, deadline_s)

        results = await asyncio.gather(*(at(i, when) for i, when in enumerate(arrivals)))
    return summarize(rate, duration_s, list(results))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(rate: float, duration_s: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(results)
    ok = [r["s"] for r in results if r["status"] == 200]
    refused = [r["s"] for r in results if r["status"] == 429]
    other = [r["status"] for r in results if r["status"] not in (200, 429, "timeout")]
    return {
        "rate": rate,
        "requests": n,
        "goodput_rps": len(ok) / duration_s,
        "ok": len(ok),
        "refused": len(refused),
        "timed_out": sum(1 for r in results if r["status"] == "timeout"),
        "other": len(other),
        "other_kinds": sorted({str(s) for s in other}),
        "ok_latency_p50_s": pct(ok, 0.5),
        "ok_latency_p99_s": pct(ok, 0.99),
        "refusal_p50_s": pct(refused, 0.5),
        "refusal_p99_s": pct(refused, 0.99),
    }


async def idle(timeout_s: float = 120) -> None:
    """Wait until a probe request is answered quickly (the previous load's work is gone)."""
    async with client() as c:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = await one(c, -1, 4, 30)
            if out["status"] == 200 and out["s"] < 2:
                return
            await asyncio.sleep(2)


def run_system(name: str, extra: list[str], env: dict[str, str], args: argparse.Namespace, cap: float | None) -> Any:
    log = open(WORK / f"overload_{name}.log", "wb")  # noqa: SIM115 - the server's life
    proc = subprocess.Popen(
        tetriserve_cmd(*extra), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_ready(URL, proc)
        if cap is None:
            print(f"== {name}: measuring capacity ({args.concurrency} clients)", flush=True)
            cap = asyncio.run(capacity(args.concurrency, args.warmup, args.measure, args.max_tokens))
            print(f"   capacity {cap:.2f} req/s", flush=True)
        rows = []
        for k, load in enumerate(args.loads):
            asyncio.run(idle())
            rate = load * cap
            print(f"== {name}: {load}x capacity = {rate:.2f} req/s for {args.duration} s", flush=True)
            row = asyncio.run(offered(rate, args.duration, args.deadline, args.max_tokens, args.seed + k))
            row["load"] = load
            print("   " + json.dumps({k: v for k, v in row.items() if k != "other_kinds"}), flush=True)
            rows.append(row)
        return cap, rows
    finally:
        stop(proc)
        log.close()


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def report(cap: float, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, facts: dict[str, str]) -> None:
    data = {**facts, "args": vars(args), "capacity_rps": cap, "runs": runs}
    RESULTS.joinpath("overload_goodput.json").write_text(json.dumps(data, indent=1))
    lines = [
        "# Goodput and refusals against offered load",
        "",
        *provenance(facts),
        "",
        f"Capacity (closed loop, {args.concurrency} clients, on the bounded service): **{cap:.2f} req/s**. Each load "
        f"offers Poisson arrivals for {args.duration} s; a client waits at most {args.deadline} s. Requests: a "
        f"~60-token prompt, {args.max_tokens} output tokens (`ignore_eos`). Goodput: answered 200 within the "
        "deadline, per second offered. tetriserve's default config (1 prefill + 1 decode worker); the "
        "client runs on the same cores.",
        "",
        "| load | offered req/s | goodput bounded | goodput unbounded | bounded / unbounded | refused (bounded) "
        "| refusal p50 / p99 s | timed out bounded / unbounded | p50 latency of answered, bounded / unbounded s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b, u in zip(runs["bounded"], runs["unbounded"], strict=True):
        ratio = b["goodput_rps"] / u["goodput_rps"] if u["goodput_rps"] else None
        lines.append(
            f"| {b['load']}× | {b['rate']:.2f} | {b['goodput_rps']:.2f} | {u['goodput_rps']:.2f} | {fmt(ratio)} "
            f"| {b['refused'] / b['requests']:.0%} ({b['refused']}/{b['requests']}) "
            f"| {fmt(b['refusal_p50_s'])} / {fmt(b['refusal_p99_s'])} "
            f"| {b['timed_out'] / b['requests']:.0%} / {u['timed_out'] / u['requests']:.0%} "
            f"| {fmt(b['ok_latency_p50_s'], '.1f')} / {fmt(u['ok_latency_p50_s'], '.1f')} |"
        )
    others = {n: sorted({k for r in rs for k in r["other_kinds"]}) for n, rs in runs.items()}
    lines += ["", f"Other outcomes (neither 200, 429 nor a client timeout): {others}", ""]
    RESULTS.joinpath("overload_goodput.md").write_text("\n".join(lines))
    plot(runs)


def plot(runs: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in runs.items():
        loads = [r["load"] for r in rows]
        ax1.plot(loads, [r["goodput_rps"] for r in rows], marker="o", label=name)
        ax2.plot(loads, [r["refused"] / r["requests"] for r in rows], marker="o", label=f"{name}: refused")
        ax2.plot(loads, [r["timed_out"] / r["requests"] for r in rows], marker="x", ls="--", label=f"{name}: timed out")
    ax1.set(xlabel="offered load (× capacity)", ylabel="goodput (req/s answered within the deadline)")
    ax2.set(xlabel="offered load (× capacity)", ylabel="share of requests")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "overload_goodput.png", dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", type=float, nargs="+", default=[0.5, 1, 2, 3, 5])
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--deadline", type=float, default=60)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--warmup", type=float, default=15)
    p.add_argument("--measure", type=float, default=45)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    facts = run_facts()
    _, _, env = prepare()
    WORK.mkdir(parents=True, exist_ok=True)
    unbounded = WORK / "overload_unbounded.yaml"
    unbounded.write_text(UNBOUNDED)
    cap, bounded = run_system("bounded", [], env, args, None)
    _, unbounded_rows = run_system("unbounded", ["--config", str(unbounded)], env, args, cap)
    report(cap, {"bounded": bounded, "unbounded": unbounded_rows}, args, facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
