"""Imported first by every probe in this folder: it puts this folder and ``benchmarks/`` on ``sys.path`` (a probe
imports the suite's helpers, ``vllm_bench_serve``, ``bench_results``, ..., and other probes by module name) and
sends the probe's reports to ``benchmarks/_work/diagnostics/`` (``TETRISERVE_BENCH_RESULTS``, unless it is set),
so that ``benchmarks/results/`` keeps only the suite's current results."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (str(ROOT / "benchmarks"), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ.setdefault("TETRISERVE_BENCH_RESULTS", str(ROOT / "benchmarks" / "_work" / "diagnostics"))
Path(os.environ["TETRISERVE_BENCH_RESULTS"]).mkdir(parents=True, exist_ok=True)
