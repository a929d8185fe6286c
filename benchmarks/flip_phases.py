"""A phase-changing workload on the same workers with fixed roles, the ``tetriinfer`` and the ``slo`` flip policy.

    python benchmarks/flip_phases.py --seconds-per-phase 45 --seed 0

One workload (``common/workload.py``, ShareGPT prompts and answer lengths, Poisson arrivals, every request with
the same SLO): prefill-heavy (HPLD: prompts > 512 tokens, outputs ≤ 128), then decode-heavy (LPHD: prompts
≤ 512, outputs > 128), then mixed. Each configuration starts a fresh `tetriserve serve` with the same
workers (default 2 prefill + 1 decode), warms it, replays the workload over gRPC (outputs forced to their
lengths with ``ignore_eos``) and polls `status` every 0.5 s for each worker's role, lifecycle and queue. Writes
``benchmarks/results/flip_phases.{md,json,png}``: TTFT, TPOT, JCT and goodput under the SLO per configuration
and phase, every flip with its durations, and a timeline of roles and queues; a line per configuration as it
starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import run_facts
from vllm_bench_report import RESULTS, ROOT, WORK
from vllm_bench_serve import stop

GRPC = "127.0.0.1:50161"
CONFIGS = {
    "fixed": [],
    "tetriinfer": ["--flip-policy", "tetriinfer", "--flip-interval", "10"],
    "slo": ["--flip-policy", "slo"],
}


def build(args: argparse.Namespace, model: str) -> Any:
    from transformers import AutoTokenizer

    from tetriserve.common.request import SLO
    from tetriserve.common.workload import Phase, WorkloadClass, build_workload, sharegpt_pool

    tok = AutoTokenizer.from_pretrained(model)
    pool = sharegpt_pool(lambda s: len(tok.encode(s, add_special_tokens=False)), max_scan=args.scan)
    pool = [s for s in pool if s.prompt_tokens + min(s.output_tokens, args.max_output) < 2000]
    slo = SLO(ttft_ms=args.ttft_slo_ms, tbt_ms=args.tpot_slo_ms)
    t = args.seconds_per_phase
    phases = [
        Phase("prefill-heavy", WorkloadClass.HPLD, int(t * args.prefill_rate), args.prefill_rate, slo=slo),
        Phase("decode-heavy", WorkloadClass.LPHD, int(t * args.decode_rate), args.decode_rate, slo=slo),
        Phase("mixed", WorkloadClass.MIXED, int(t * args.mixed_rate), args.mixed_rate, slo=slo),
    ]
    return build_workload(pool, phases, args.seed)


async def replay(workload: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from tetriserve.client import AsyncTetriServeClient

    results: list[dict[str, Any]] = []
    async with AsyncTetriServeClient(GRPC, timeout=600) as client:
        t0 = time.monotonic()

        async def one(r: Any) -> None:
            await asyncio.sleep(max(0.0, r.arrival_s - (time.monotonic() - t0)))
            sent = time.monotonic()
            first = None
            n = 0
            error = None
            try:
                max_tokens = min(r.output_tokens, args.max_output)
                opts = dict(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
                async with client.generate(r.prompt, **opts, slo_ttft_ms=r.slo.ttft_ms, slo_tbt_ms=r.slo.tbt_ms) as s:
                    async for chunk in s:
                        if chunk.token_ids and first is None:
                            first = time.monotonic()
                        n += len(chunk.token_ids)
            except Exception as exc:  # a refusal or failure counts against the configuration
                error = f"{type(exc).__name__}: {exc}"
            end = time.monotonic()
            results.append(
                {
                    "index": r.index,
                    "phase": r.phase,
                    "sent_s": sent - t0,
                    "ttft_ms": None if first is None else (first - sent) * 1e3,
                    "tpot_ms": None if first is None or n < 2 else (end - first) * 1e3 / (n - 1),
                    "jct_ms": (end - sent) * 1e3,
                    "tokens": n,
                    "error": error,
                }
            )

        await asyncio.gather(*(one(r) for r in workload.requests))
    return sorted(results, key=lambda x: x["index"])


async def poll(timeline: list[dict[str, Any]], done: asyncio.Event) -> None:
    from tetriserve.client import AsyncTetriServeClient

    async with AsyncTetriServeClient(GRPC, timeout=10) as client:
        t0 = time.monotonic()
        while not done.is_set():
            try:
                st = await client.cluster_status()
                workers = {
                    w.worker_id: {
                        "role": w.role,
                        "lifecycle": w.lifecycle,
                        "health": w.health,
                        "queued": w.load.get("queued", 0.0),
                        "running": w.load.get("running", 0.0),
                        "flips": w.flips,
                        "last_flip_ms": w.last_flip_ms,
                        "last_flip_switch_ms": w.last_flip_switch_ms,
                        "last_flip_engine_ms": w.last_flip_engine_ms,
                    }
                    for w in st.workers
                }
                timeline.append({"t": time.monotonic() - t0, "workers": workers})
            except Exception as exc:
                print(f"status poll failed: {exc}", flush=True)
            await asyncio.sleep(0.5)


@contextmanager
def serving(cmd: list[str], target: str, log_path: Path) -> Iterator[None]:
    """A `tetriserve serve` (``cmd``) answering health over gRPC at ``target``, warmed up (compiled graphs,
    caches); stopped on the way out."""
    from tetriserve.client import TetriServeClient

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while True:
                assert proc.poll() is None, f"server exited, see {log.name}"
                try:
                    with TetriServeClient(target, timeout=5) as c:
                        if c.health().serving:
                            break
                except Exception:
                    pass
                assert time.monotonic() < deadline, f"not serving after 600 s, see {log.name}"
                time.sleep(1)
            with TetriServeClient(target, timeout=120) as c:
                for i in range(8):
                    c.complete("warm up " * (20 * i + 1), max_tokens=32, ignore_eos=True)
            yield
        finally:
            stop(proc)


def serve_and_run(name: str, flags: list[str], workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tetriserve.cli.main", "serve", "--grpc-port", GRPC.rsplit(":", 1)[1],
           "--http-port", "8160", "--kv-cache-gb", "2", "--num-prefill", str(args.num_prefill),
           "--num-decode", str(args.num_decode),
           "--predictor", "baseline", *flags]  # fmt: skip
    with serving(cmd, GRPC, WORK / f"flip_phases_{name}.log"):

        async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            timeline: list[dict[str, Any]] = []
            done = asyncio.Event()
            poller = asyncio.create_task(poll(timeline, done))
            results = await replay(workload, args)
            await asyncio.sleep(2)
            done.set()
            await poller
            return results, timeline

        print(f"== {name}: {len(workload.requests)} requests", flush=True)
        results, timeline = asyncio.run(run())
    return {"flags": flags, "results": results, "timeline": timeline}


def summarize(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    def stats(rows: list[dict[str, Any]], duration_s: float) -> dict[str, Any]:
        ok = [r for r in rows if r["error"] is None and r["ttft_ms"] is not None]

        def med(key: str) -> float | None:
            vals = [r[key] for r in ok if r[key] is not None]
            return statistics.median(vals) if vals else None

        def p90(key: str) -> float | None:
            vals = sorted(r[key] for r in ok if r[key] is not None)
            return vals[int(0.9 * (len(vals) - 1))] if vals else None

        # not common.workload.attained: a request with one output token has no time per output token to miss
        met = [
            r
            for r in ok
            if r["ttft_ms"] <= args.ttft_slo_ms and (r["tpot_ms"] is None or r["tpot_ms"] <= args.tpot_slo_ms)
        ]
        return {
            "requests": len(rows),
            "failed": len(rows) - len(ok),
            "median_ttft_ms": med("ttft_ms"),
            "p90_ttft_ms": p90("ttft_ms"),
            "median_tpot_ms": med("tpot_ms"),
            "p90_tpot_ms": p90("tpot_ms"),
            "median_jct_ms": med("jct_ms"),
            "slo_attainment": len(met) / len(rows) if rows else None,
            "goodput_rps": len(met) / duration_s if duration_s > 0 else None,
        }

    rows = run["results"]
    end = max(r["sent_s"] + r["jct_ms"] / 1e3 for r in rows)
    out = {"all": stats(rows, end)}
    for phase in dict.fromkeys(r["phase"] for r in rows):
        sub = [r for r in rows if r["phase"] == phase]
        span = max(r["sent_s"] + r["jct_ms"] / 1e3 for r in sub) - min(r["sent_s"] for r in sub)
        out[phase] = stats(sub, span)
    return out


def flips(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every flip seen in the status polls: when it was done, which worker, to which role, its durations (the
    time to the first request served in the new role arrives with a later poll)."""
    out: list[dict[str, Any]] = []
    latest: dict[str, dict[str, Any]] = {}
    for snap in timeline:
        for wid, w in snap["workers"].items():
            entry = latest.get(wid)
            if w["flips"] > (entry["n"] if entry else 0):
                entry = latest[wid] = {"n": w["flips"], "t_s": round(snap["t"], 1), "worker": wid, "to": w["role"]}
                out.append(entry)
            if entry is not None and entry["n"] == w["flips"]:
                entry["switch_ms"] = w["last_flip_switch_ms"]
                entry["engine_swap_ms"] = w.get("last_flip_engine_ms")
                entry["decision_to_served_ms"] = w["last_flip_ms"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds-per-phase", type=float, default=45.0)
    ap.add_argument("--num-prefill", type=int, default=2, help="prefill workers at the start")
    ap.add_argument("--num-decode", type=int, default=1, help="decode workers at the start")
    ap.add_argument("--prefill-rate", type=float, default=10.0, help="req/s of the prefill-heavy phase")
    ap.add_argument("--decode-rate", type=float, default=3.0, help="req/s of the decode-heavy phase")
    ap.add_argument("--mixed-rate", type=float, default=4.0, help="req/s of the mixed phase")
    ap.add_argument("--max-output", type=int, default=512, help="cap on a request's output tokens")
    ap.add_argument("--ttft-slo-ms", type=float, default=500.0)
    ap.add_argument("--tpot-slo-ms", type=float, default=20.0)
    ap.add_argument("--scan", type=int, default=30000, help="ShareGPT records read for the pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = ap.parse_args()
    facts = run_facts()
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    WORK.mkdir(parents=True, exist_ok=True)
    model = str(build_tiny_model(default_tiny_model_dir()))
    workload = build(args, model)
    runs = {}
    for i, name in enumerate(args.configs, 1):
        print(f"== [{i}/{len(args.configs)}] {name}", flush=True)
        runs[name] = serve_and_run(name, CONFIGS[name], workload, args)
    classes = {c.value: n for c, n in workload.counts_by_class().items()}
    configs = {
        name: {"flags": run["flags"], "summary": summarize(run, args), "flips": flips(run["timeline"])}
        for name, run in runs.items()
    }
    report = {
        **facts,
        "args": vars(args),
        "workload": {"requests": len(workload.requests), "phases": workload.phases(), "classes": classes},
        "configs": configs,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "flip_phases.json").write_text(json.dumps(report, indent=1))
    from flip_phases_report import write_report

    write_report(report, RESULTS / "flip_phases.md", RESULTS / "flip_phases.png")
    print((RESULTS / "flip_phases.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
