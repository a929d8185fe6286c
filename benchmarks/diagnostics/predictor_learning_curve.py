"""Validation accuracy of the fast-mode heads vs training-set size (how much would more data buy?).

Uses the pairs and cached embeddings of `tetriserve predictor train --limit 36000` (run that first),
trains g=200 heads on the first 1/8, 1/4, 1/2 and all of the train split, and reports val accuracy.

    python benchmarks/diagnostics/predictor_learning_curve.py [--limit 36000] [--granularity 200]

Writes ``length_predictor_learning_curve.md`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS, ROOT

sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=36000)
    ap.add_argument("--granularity", type=int, default=200)
    args = ap.parse_args()
    logging.disable(logging.INFO)
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.length_predictor.commands import DataOptions, load_pairs, split_xy
    from tetriserve.length_predictor.data import by_split
    from tetriserve.length_predictor.train import TrainConfig, train_heads

    splits = by_split(load_pairs(DataOptions(str(build_tiny_model(default_tiny_model_dir())), args.limit), False))
    tx, ty = split_xy(splits["train"], False)
    vx, vy = split_xy(splits["val"], False)
    cfg = replace(TrainConfig(progress=False), granularity=args.granularity)
    rows = []
    for frac in (8, 4, 2, 1):
        n = len(tx) // frac
        rows.append((n, train_heads(tx[:n], ty[:n], vx, vy, cfg).metrics["val_accuracy"]))
    lines = [
        f"# Length predictor: val accuracy vs training pairs (g={args.granularity}, fast mode)",
        "",
        f"Command: `python benchmarks/diagnostics/predictor_learning_curve.py --limit {args.limit} "
        f"--granularity {args.granularity}`; val split: {len(vx)} pairs.",
        "",
        "| training pairs | val accuracy |",
        "| ---: | ---: |",
        *[f"| {n} | {100 * acc:.1f}% |" for n, acc in rows],
    ]
    text = "\n".join(lines) + "\n"
    (RESULTS / "length_predictor_learning_curve.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
