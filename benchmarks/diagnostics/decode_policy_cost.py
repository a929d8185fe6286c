"""What each decode admission policy costs the engine thread per step, by batch and queue size.

    python benchmarks/diagnostics/decode_policy_cost.py [--running 8] [--waiting 1 4 16] [--steps 300]

The decode engine asks its admission policy about every waiting request at every step (``DecodePlanner.admit``,
``decode_worker/planner.py``), on the engine thread, between two model steps. This builds random states — a
running batch of ``--running`` requests with length predictions, ``--waiting`` requests queued, a KV pool about
half free — and times ``admit`` on each policy with its defaults, the median step's in microseconds. The
policies that check the batch's KV peak (reserve-dynamic, SOLA, CacheOpt; ``decode_worker/admission/peak.py``)
are also timed with the peak summed member by member (``peak.peak_fits_by_sum``, the module docstring's
definition), to show what its array form saves. Writes ``decode_policy_cost.{md,json}`` (in
``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import measure_or_reload

from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import ADMISSION_NAMES, make_admission_policy, peak
from tetriserve.decode_worker.planner import DecodePlanner
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

BLOCK = 16
PEAK_POLICIES = ("reserve-dynamic", "sola", "cacheopt")


def _view(rng: random.Random, rid: str, now: float, generated: int) -> DecodeReqView:
    prompt = rng.randint(32, 600)
    lower = rng.randint(16, 400)
    est = LengthEstimate(lower, lower, lower + 200, 0, 0.9, "probe")
    return DecodeReqView(
        rid, prompt, 1024, arrival_time=now - rng.uniform(0, 5), generated=generated, estimate=est, tbt_slo_s=0.1
    )


def states(rng: random.Random, running: int, waiting: int, n: int) -> list[tuple[list[DecodeReqView], DecodeState]]:
    out = []
    for i in range(n):
        now = 1000.0 + i
        batch = []
        for j in range(running):
            v = _view(rng, f"r{j}", now, rng.randint(0, 100))
            batch.append(replace(v, held_blocks=blocks_for(v.context, BLOCK)))
        queue = [_view(rng, f"w{j}", now, 0) for j in range(waiting)]
        held = sum(v.held_blocks for v in batch)
        out.append((queue, DecodeState(held + rng.randint(20, 200), BLOCK, tuple(batch), now, 0.007, 0.01)))
    return out


@contextmanager
def member_by_member() -> Iterator[None]:
    fast = peak.peak_fits
    peak.peak_fits = peak.peak_fits_by_sum
    try:
        yield
    finally:
        peak.peak_fits = fast


def time_policy(name: str, cases: list[tuple[list[DecodeReqView], DecodeState]]) -> float:
    """The median ``admit`` over ``cases``, in microseconds."""
    planner = DecodePlanner(admission=make_admission_policy(name))
    times = []
    for queue, state in cases:
        started = time.perf_counter()
        planner.admit(queue, state)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, float]] = {}
    for waiting in args.waiting:
        cases = states(random.Random(args.seed + waiting), args.running, waiting, args.steps)
        for name in ADMISSION_NAMES:
            rows.setdefault(name, {})[str(waiting)] = time_policy(name, cases)
            if name in PEAK_POLICIES:
                with member_by_member():
                    rows.setdefault(f"{name} (peak member by member)", {})[str(waiting)] = time_policy(name, cases)
    return {"running": args.running, "steps": args.steps, "seed": args.seed, "median_us": rows}


def report(d: dict[str, Any]) -> str:
    waits = list(next(iter(d["median_us"].values())))
    lines = [
        "# What each decode admission policy costs per step",
        "",
        f"Command: `{d['command'].strip()}`  ",
        f"Median microseconds of one step's admission (`DecodePlanner.admit`) over {d['steps']} random states, "
        f"each with {d['running']} requests running and the given number waiting, on one thread.",
        "",
        "| policy | " + " | ".join(f"{w} waiting" for w in waits) + " |",
        "| --- |" + " ---: |" * len(waits),
    ]
    for name, row in d["median_us"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[w]:.0f}" for w in waits) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=8)
    ap.add_argument("--waiting", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("decode_policy_cost", args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
