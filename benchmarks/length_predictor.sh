#!/usr/bin/env bash
# Reproduces the length predictor's committed results (README "Length predictor"):
#   benchmarks/results/length_predictor{.md,.json,_*.png}, _train.log, _learning_curve.md, _serving.md
# and the committed heads in length_predictor/artifacts/. CPU budget on a 2-core machine: ~14 min to embed
# the 36,000 prompts once (cached under $TETRISERVE_HOME/predictor/cache), ~1 min to train three
# granularities, seconds to evaluate, ~4 min for the serving benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1
.venv/bin/tetriserve predictor train --granularity 100 200 400 --fast --limit 36000 --no-progress 2>&1 \
    | grep -v "^{'loss\|^{'train_runtime" | tee benchmarks/results/length_predictor_train.log
.venv/bin/tetriserve predictor export --granularity 100 200 400
.venv/bin/tetriserve predictor eval --granularity 100 200 400 --from artifacts --out benchmarks/results
.venv/bin/python benchmarks/predictor_learning_curve.py --limit 36000 --granularity 200
.venv/bin/python benchmarks/predictor_serving.py --prompts 256 --rounds 5
