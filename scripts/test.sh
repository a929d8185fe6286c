#!/usr/bin/env bash
# Set up (with dev tools) and run every check CI runs: import contracts, lint, unit + integration + e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
echo "==> import contracts"
.venv/bin/lint-imports
echo "==> ruff"
.venv/bin/ruff check .
echo "==> mypy --strict (common and the policy packages)"
.venv/bin/mypy common prefill_worker/queue prefill_worker/chunking prefill_worker/dispatch prefill_worker/views.py prefill_worker/policy.py decode_worker/views.py decode_worker/admission decode_worker/preemption decode_worker/policy.py decode_worker/slices.py length_predictor/baseline.py \
    length_predictor/buckets.py length_predictor/padding.py length_predictor/batcher.py length_predictor/oracle.py
echo "==> tests"
.venv/bin/python -m pytest -q "$@"
