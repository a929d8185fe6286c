"""First tokens of a saturation run by request index (issue #12, session 68).

    python benchmarks/ttft_by_index.py link ray

Reads the benchmark client's per-request file that ``engine_steps.py`` leaves for the last repeat of each named
variant (``benchmarks/_work/bench_steps_<variant>_saturation.json``) and prints, per variant, the client's run
time and the median TTFT of each 20 requests in the order the client sent them (a Markdown table).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"


def main() -> int:
    print("| variant | client duration s | median TTFT s of requests 0-19, 20-39, ... (by index) |")
    print("| --- | ---: | --- |")
    for variant in sys.argv[1:]:
        run = json.loads((WORK / f"bench_steps_{variant}_saturation.json").read_text())
        ttfts = run["ttfts"]
        medians = ", ".join(f"{statistics.median(ttfts[i : i + 20]):.2f}" for i in range(0, len(ttfts), 20))
        print(f"| {variant} | {run['duration']:.2f} | {medians} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
