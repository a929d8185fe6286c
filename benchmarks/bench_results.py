"""A micro-benchmark's command line and its saved result: measured now, or reloaded to rewrite the report.

``measure_or_reload`` keeps each run's result with the command that made it (``benchmarks/results/<name>.json``)
and writes the Markdown report from it; ``gpu_args`` is the shared command line of the GPU probes, which say so
and measure nothing where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

from vllm_bench_report import RESULTS, WORK


def gpu_args(doc: str, name: str) -> argparse.Namespace | None:
    """The command line of a GPU benchmark (``--sizes-mib``, ``--repeats``, ``--report-only``), or None, said
    aloud, when there is nothing to measure on: no CUDA device and no ``--report-only``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    if not args.report_only:
        import torch

        if not torch.cuda.is_available():
            print(f"{name}: no CUDA device here; nothing measured")
            return None
    return args


def measure_or_reload(
    name: str,
    report_only: bool,
    measure: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    script: str | None = None,
) -> int:
    """Run ``measure`` and save its result with the command that made it (``benchmarks/results/<name>.json``), or
    with ``report_only`` read the saved one; then write and print the report ``<name>.md`` (``script``: the
    benchmark's file name when it is not ``name``)."""
    out = RESULTS / f"{name}.json"
    if report_only:
        data = json.loads(out.read_text())
    else:
        WORK.mkdir(parents=True, exist_ok=True)
        data = {"command": f"python benchmarks/{script or name}.py " + shlex.join(sys.argv[1:]), **measure()}
        out.write_text(json.dumps(data, indent=1))
    md = report(data)
    (RESULTS / f"{name}.md").write_text(md)
    print(md)
    return 0
