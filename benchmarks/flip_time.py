"""How long a flip takes: the role swap on the engine, the switch as the control plane sees it, and the order
until the first request served in the new role (TetriInfer §3.5 measures 5–7 ms for the swap).

    python benchmarks/flip_time.py --flips 10

A fresh `tetriserve serve` (1 prefill + 2 decode workers, tiny model) driven the way an operator does, over
gRPC with the SDK: ``flip decode-1`` to the other role, wait until `status` shows it active in that role,
send ``--requests`` completions at once (again, until the worker has served one), read its flip timings from
`status`; then flip it back, ``--flips`` times in all. The cluster is otherwise idle, so the drain ends as
soon as it may (1 s).
Writes ``benchmarks/results/flip_time.{md,json}``; prints a line per flip.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import measure_or_reload, provenance
from flip_phases import serving
from vllm_bench_report import WORK

GRPC = "127.0.0.1:50171"
WORKER = "decode-1"


def wait_until(client: Any, done: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        w = next(w for w in client.cluster_status().workers if w.worker_id == WORKER)
        if done(w):
            return w
        assert time.monotonic() < deadline, f"not {what} within {seconds:g} s: {w}"
        time.sleep(0.05)


def one_flip(client: Any, role: str, requests: int) -> dict[str, Any]:
    before = wait_until(client, lambda w: w.lifecycle == "active", 60, "active")
    t0 = time.monotonic()
    client.flip(WORKER, role)
    wait_until(client, lambda w: w.role == role and w.lifecycle == "active", 120, f"serving {role}")
    active_s = time.monotonic() - t0
    for _ in range(20):  # batches until the flipped worker has served one (placement may not pick it at once)
        with ThreadPoolExecutor(requests) as pool:
            list(pool.map(lambda i: client.complete(f"flip {i} " * (8 + i), max_tokens=16, ignore_eos=True),
                          range(requests)))  # fmt: skip
        time.sleep(0.3)  # a controller tick
        w = next(w for w in client.cluster_status().workers if w.worker_id == WORKER)
        if w.last_flip_ms is not None:
            break
    assert w.last_flip_ms is not None, f"not served in its new role: {w}"
    assert w.flips == before.flips + 1 and w.incarnation == before.incarnation, w  # the same life: no restart
    return {
        "to": role,
        "engine_swap_ms": w.last_flip_engine_ms,
        "switch_ms": w.last_flip_switch_ms,
        "order_to_served_ms": w.last_flip_ms,
        "order_to_active_ms_client": active_s * 1e3,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tetriserve.client import TetriServeClient

    cmd = [sys.executable, "-m", "tetriserve.cli.main", "serve", "--grpc-port", GRPC.rsplit(":", 1)[1],
           "--http-port", "8170", "--num-prefill", "1", "--num-decode", "2", "--predictor", "baseline"]  # fmt: skip
    with serving(cmd, GRPC, WORK / "flip_time_serve.log"), TetriServeClient(GRPC, timeout=120) as c:
        flips = []
        for k in range(args.flips):
            role = "prefill" if k % 2 == 0 else "decode"
            flips.append(one_flip(c, role, args.requests))
            print(f"flip {k + 1}/{args.flips}: {flips[-1]}", flush=True)
        return flips


def report(data: dict[str, Any]) -> str:
    flips = data["flips"]

    def med(key: str, rows: list[dict[str, Any]]) -> str:
        vals = [r[key] for r in rows if r[key] is not None]
        return f"{statistics.median(vals):.1f}" if vals else "-"

    keys = ["engine_swap_ms", "switch_ms", "order_to_served_ms", "order_to_active_ms_client"]
    lines = [
        "# Flip time",
        "",
        *provenance(data),
        "One `tetriserve serve` (1 prefill + 2 decode workers, tiny model, otherwise idle); "
        f"`{WORKER}` flipped to the other role and back over gRPC, as an operator does. Swap: the role change on "
        "the engine, timed by the worker (TetriInfer's 5–7 ms). Switch: end of the drain until the control plane "
        "saw the worker serve in its new role (its 0.25 s ticks and the worker's first report in the new role "
        "included). Order → served: from the order, the drain included (at least 1 s, so a dispatch decided "
        "just before lands), until the first request served in the new role. Order → active (client): until "
        "`status` showed the worker active in its new role.",
        "",
        "| flips to | n | swap ms | switch ms | order → served ms | order → active ms (client) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for role in ("prefill", "decode", None):
        rows = [f for f in flips if role is None or f["to"] == role]
        name = role or "all"
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(med(k, rows) for k in keys) + " |")
    lines += ["", "Medians. Every flip:", "", "| # | to | " + " | ".join(keys) + " |", "| ---: | --- |" + " ---: |" * 4]
    for i, f in enumerate(flips, 1):
        cells = [f"{f[k]:.1f}" if f[k] is not None else "-" for k in keys]
        lines.append(f"| {i} | {f['to']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flips", type=int, default=10)
    ap.add_argument("--requests", type=int, default=6, help="completions sent after each flip")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("flip_time", args.report_only, lambda: {"flips": run(args)}, report)


if __name__ == "__main__":
    raise SystemExit(main())
