"""The length predictor's held-out report: bucket accuracy, calibration and the padded estimate's provisioning.

    python benchmarks/length_predictor.py [--granularity 100 200 400]

Runs ``tetriserve predictor eval --from artifacts`` on the committed heads (``length_predictor/artifacts/``):
the test split of the ShareGPT pairs (never seen in training or in fitting the padding), each granularity's
bucket accuracy against the majority bucket, a prompt-length-only baseline and TetriInfer's figures, the
classifier's calibration, and CacheOpt Fig. 17h's under- and over-provisioning of the padded estimate. Writes
``benchmarks/results/length_predictor.{md,json}`` and ``length_predictor_{confusion_g<g>,calibration,
provisioning}.png``; the report's head gets the command, machine, commit and date. Seconds once the test
prompts' embeddings are cached (``$TETRISERVE_HOME/predictor/cache``), a few minutes on 2 cores before.
Retraining the heads is ``benchmarks/diagnostics/length_predictor.sh``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import RESULTS, run_cli, run_facts, shown, stamp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--granularity", type=int, nargs="+", default=[100, 200, 400], help="bucket widths")
    args = ap.parse_args()
    facts = run_facts()
    granularity = [str(g) for g in args.granularity]
    cli = ["predictor", "eval", "--granularity", *granularity, "--from", "artifacts", "--out", shown(RESULTS)]
    rc = run_cli(cli, {"OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"})
    if rc == 0:
        stamp(RESULTS / "length_predictor.md", facts)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
