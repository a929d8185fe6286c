#!/usr/bin/env bash
# Retrains the length predictor's heads and reruns everything measured on them: the heads in
# length_predictor/artifacts/ (committed), the suite's held-out report (benchmarks/results/length_predictor*,
# `python benchmarks/length_predictor.py`) and its serving cost (benchmarks/results/predictor_serving.*), and,
# under benchmarks/_work/diagnostics/, the training log and the learning curve. CPU budget on a 2-core machine:
# ~14 min to embed the 36,000 prompts once (cached under $TETRISERVE_HOME/predictor/cache), ~1 min to train three
# granularities, seconds to evaluate, ~4 min for the serving benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1
mkdir -p benchmarks/_work/diagnostics
.venv/bin/tetriserve predictor train --granularity 100 200 400 --fast --limit 36000 --no-progress 2>&1 \
    | grep -v "^{'loss\|^{'train_runtime" | tee benchmarks/_work/diagnostics/length_predictor_train.log
.venv/bin/tetriserve predictor export --granularity 100 200 400
.venv/bin/python benchmarks/length_predictor.py --granularity 100 200 400
.venv/bin/python benchmarks/diagnostics/predictor_learning_curve.py --limit 36000 --granularity 200
.venv/bin/python benchmarks/predictor_serving.py --prompts 256 --rounds 5
