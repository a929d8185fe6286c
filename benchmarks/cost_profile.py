"""The tiny model's cost profile on this machine: SOLA eq. 3/4 fitted to timed engine steps, and the pivot.

    python benchmarks/cost_profile.py [--threads 1] [--repeats 3]

Runs ``tetriserve profile`` (one in-process vLLM engine, compiled, ``--threads`` OMP threads): a sweep of
forward sizes and batch shapes, each iteration timed around ``engine.step()``; SOLA's prefill (eq. 3) and decode
(eq. 4) models fitted on a train split with their held-out error; AccelGen's pivot S_pf (the smallest forward
reaching 90% of the best prefill throughput) and T̄_pf (TetriInfer's ChunkSize). Writes
``benchmarks/results/cost_profile.{json,md,png}``; the JSON is the cost profile the prefill benchmarks
(``prefill_policies.py``, ``prefill_slo.py``) read, and a prefill worker reads with ``--cost-profile`` (or from
``$TETRISERVE_HOME/profiles/<model>--<hardware>.json``). About 3 minutes on 2 cores, with a progress bar.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import RESULTS, run_cli, run_facts, shown, stamp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the engine")
    ap.add_argument("--repeats", type=int, default=None, help="runs per scenario (the CLI's default: 3)")
    args = ap.parse_args()
    facts = run_facts()
    out = RESULTS / "cost_profile.json"
    cli = ["profile", "--out", shown(out), "--threads", str(args.threads)]
    cli += ["--repeats", str(args.repeats)] if args.repeats else []
    rc = run_cli(cli, {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"})
    if rc == 0:
        stamp(out.with_suffix(".md"), facts, replace_prefix="Command: `tetriserve profile")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
