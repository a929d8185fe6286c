"""The prefill pace replayed on a served prefill worker's own report intervals: an average of each interval's
seconds per token against the ratio of aged sums that ``prefill_worker/pace.py`` keeps.

    python benchmarks/diagnostics/prefill_pace_replay.py

The GlobalScheduler places a prompt on a prefill worker only if the worker's queue, priced at its pace, would
take at most ``admission.max_wait_s`` (30 s). The intervals (``prefill_pace_intervals.json`` beside this script;
how they were logged is in the file) come from a 64-prompt warm-up and then 300 prompts at once. For each way of
reading them the report gives the pace's median and largest value over the intervals, and, at the largest, how
many prompt tokens a burst could queue within the bound. Writes ``prefill_pace_replay.{md,json}`` (under
``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tetriserve.engine.stats import EngineStats
from tetriserve.prefill_worker.pace import PrefillPace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import RESULTS

BOUND_S = 30.0
ALPHA = 0.3  # the per-interval average's weight of the newest interval


def per_interval_average(intervals: list[dict]) -> list[float]:
    """An exponential average of each interval's seconds per token: a lightly loaded worker's short intervals,
    with their fixed step costs, read many times slower than the worker is."""
    out, pace = [], 0.0
    for iv in intervals:
        sample = iv["step_s"] / iv["tokens"]
        pace = sample if pace == 0 else ALPHA * sample + (1 - ALPHA) * pace
        out.append(pace)
    return out


def aged_sums(intervals: list[dict]) -> list[float]:
    """``PrefillPace``, fed the same intervals as cumulative engine counters."""
    pace, tokens, seconds, out = PrefillPace(), 0, 0.0, []
    pace.observe(EngineStats(prompt_tokens_total=0, step_seconds=0.0))
    for iv in intervals:
        tokens, seconds = tokens + iv["tokens"], seconds + iv["step_s"]
        pace.observe(EngineStats(prompt_tokens_total=tokens, step_seconds=seconds))
        out.append(pace.seconds_per_token)
    return out


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    data = json.loads((Path(__file__).resolve().parent / "prefill_pace_intervals.json").read_text())
    intervals = data["intervals"]
    rows = {
        "averaged per interval": per_interval_average(intervals),
        "ratio of aged sums (prefill_worker/pace.py)": aged_sums(intervals),
    }
    truth = sum(iv["step_s"] for iv in intervals) / sum(iv["tokens"] for iv in intervals)
    report = {"intervals": len(intervals), "whole_run_ms_per_token": truth * 1e3, "paces": {}}
    lines = [
        "# The prefill pace, replayed on a served worker's report intervals",
        "",
        "Command: `python benchmarks/diagnostics/prefill_pace_replay.py`  ",
        f"{len(intervals)} report intervals of one prefill worker (warm-up, then 300 prompts at once; "
        "`benchmarks/diagnostics/prefill_pace_intervals.json` says how they were logged). "
        f"Over the whole run: {truth * 1e3:.3f} ms of steps a prompt token. Tokens within the bound: prompt tokens "
        f"a queue may hold at the largest pace and still be priced at {BOUND_S:g} s or less.",
        "",
        "| pace | median ms/token | largest ms/token | largest / whole run | tokens within the bound at the largest |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, paces in rows.items():
        med, top = statistics.median(paces), max(paces)
        report["paces"][name] = {"median_ms": med * 1e3, "max_ms": top * 1e3, "tokens_within_bound": BOUND_S / top}
        lines.append(f"| {name} | {med * 1e3:.3f} | {top * 1e3:.3f} | {top / truth:.1f} | {BOUND_S / top:,.0f} |")
    (RESULTS / "prefill_pace_replay.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "prefill_pace_replay.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
