"""First tokens of a saturation run by request index: when each part of a burst got its first token.

    python benchmarks/diagnostics/ttft_by_index.py link ray

Reads the benchmark client's per-request file that ``engine_steps.py`` leaves for the last repeat of each named
variant (``benchmarks/_work/bench_steps_<variant>_saturation.json``) and prints, per variant, the client's run
time and the median TTFT of each 20 requests in the order the client sent them (a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parents[1] / "_work"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="variant names of the engine_steps.py run")
    args = ap.parse_args()
    print("| variant | client duration s | median TTFT s of requests 0-19, 20-39, ... (by index) |")
    print("| --- | ---: | --- |")
    for variant in args.variants:
        run = json.loads((WORK / f"bench_steps_{variant}_saturation.json").read_text())
        ttfts = run["ttfts"]
        medians = ", ".join(f"{statistics.median(ttfts[i : i + 20]):.2f}" for i in range(0, len(ttfts), 20))
        print(f"| {variant} | {run['duration']:.2f} | {medians} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
