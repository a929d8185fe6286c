"""A one-thread copy into one reused buffer against buffers used in turn (the shm push's slabs).

    python benchmarks/diagnostics/copy_reuse.py [--sizes-mib 8 16 64] [--buffers 1 2 3] [--copies 30]

The shm backend's push copies each transfer into a slab of its pool; ``transport_throughput.py`` holds it to a
one-thread torch copy into one reused buffer. Whether the push reuses one slab or takes several in turn decides
how much of the copy's source and destination the CPU's cache still holds. This copies the same source, on one
thread, ``--copies`` times into each of ``--buffers`` destinations in turn (the first 5 copies not counted) and
reports GB/s, the median copy's. Writes ``copy_reuse.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import measure_or_reload

MIB = 1 << 20
WARM = 5


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    for mib in args.sizes_mib:
        src = torch.ones(mib * MIB, dtype=torch.uint8)
        dsts = [torch.zeros(mib * MIB, dtype=torch.uint8) for _ in range(max(args.buffers))]
        for k in args.buffers:
            times = []
            for i in range(args.copies):
                started = time.perf_counter()
                dsts[i % k].copy_(src)
                times.append(time.perf_counter() - started)
            out.setdefault(str(mib), {})[str(k)] = mib * MIB / statistics.median(times[WARM:]) / 1e9
    return {"gbps": out}


def report(d: dict[str, Any]) -> str:
    buffers = list(next(iter(d["gbps"].values())))
    lines = [
        "# A one-thread copy into one reused buffer against buffers used in turn",
        "",
        f"Command: `{d['command'].strip()}`  ",
        "GB/s of one torch copy on one thread (the median copy, the first 5 not counted), the same source each time, "
        "into the given number of destination buffers in turn.",
        "",
        "| MiB | " + " | ".join(f"{k} buffer{'s' if k != '1' else ''}" for k in buffers) + " |",
        "| ---: |" + " ---: |" * len(buffers),
    ]
    for mib, row in d["gbps"].items():
        lines.append(f"| {mib} | " + " | ".join(f"{row[k]:.1f}" for k in buffers) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[8, 16, 64])
    ap.add_argument("--buffers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--copies", type=int, default=30)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("copy_reuse", args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
