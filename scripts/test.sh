#!/usr/bin/env bash
# Set up (with dev tools) and run every check CI runs: import contracts, lint, unit + integration + e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
echo "==> import contracts"
.venv/bin/lint-imports
echo "==> ruff"
.venv/bin/ruff check .
echo "==> tests"
.venv/bin/python -m pytest -q "$@"
