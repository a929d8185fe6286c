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
# mypy cannot follow the editable install's import hook, so it reads the folders through a view laid out as
# they install (tetriserve/<folder> -> <folder>)
VIEW=build/typecheck
rm -rf "$VIEW" && mkdir -p "$VIEW/tetriserve"
for d in common transport engine length_predictor prefill_worker decode_worker control_plane client protos; do
    ln -s "$PWD/$d" "$VIEW/tetriserve/$d"
done
(cd "$VIEW" && MYPYPATH=. ../../.venv/bin/mypy --config-file ../../pyproject.toml --explicit-package-bases \
    tetriserve/common tetriserve/prefill_worker/queue tetriserve/prefill_worker/chunking tetriserve/prefill_worker/dispatch \
    tetriserve/prefill_worker/views.py tetriserve/prefill_worker/policy.py tetriserve/decode_worker/views.py \
    tetriserve/decode_worker/admission tetriserve/decode_worker/preemption tetriserve/decode_worker/policy.py \
    tetriserve/decode_worker/slices.py tetriserve/length_predictor/baseline.py tetriserve/length_predictor/buckets.py \
    tetriserve/length_predictor/padding.py tetriserve/length_predictor/batcher.py tetriserve/length_predictor/oracle.py \
    tetriserve/length_predictor/process.py \
    tetriserve/engine/cores.py tetriserve/control_plane/supervisor.py tetriserve/control_plane/token_log.py \
    tetriserve/prefill_worker/predictions.py tetriserve/control_plane/admission.py tetriserve/control_plane/http_limits.py \
    tetriserve/control_plane/field_checks.py tetriserve/prefill_worker/pace.py tetriserve/control_plane/flip \
    tetriserve/control_plane/elastic.py tetriserve/control_plane/key_table.py)
PYTEST=(.venv/bin/python -m pytest -q)
if [[ $# -gt 0 ]]; then  # a selection of one's own: one pytest run, as given
    echo "==> tests"
    exec "${PYTEST[@]}" "$@"
fi
# The whole suite, in two phases (on 2 cores it otherwise runs past CI's 20 minutes):
#  1. the unit tests, and beside them the e2e tests at a lower priority. The unit tests keep one core busy; the e2e
#     tests' services (`tetriserve serve`, `profile`, plain vLLM's benchmark client) mostly use the other.
#  2. the integration tests (every other folder of tests/), alone: they time kills, recoveries and streams on real
#     engines.
# Every phase runs to its end; the exit status is non-zero when any failed. PYTEST_ADDOPTS reaches each run.
E2E_LOG=$(mktemp)
E2E_PID=
trap '[[ -n $E2E_PID ]] && kill "$E2E_PID" 2>/dev/null; rm -f "$E2E_LOG"' EXIT
echo "==> unit tests, with the e2e tests beside them (their output follows the unit tests')"
nice -n 10 "${PYTEST[@]}" tests/e2e >"$E2E_LOG" 2>&1 &
E2E_PID=$!
unit=0 e2e=0 integration=0
"${PYTEST[@]}" tests/unit || unit=$?
wait "$E2E_PID" || e2e=$?
E2E_PID=
echo "==> e2e tests"
cat "$E2E_LOG"
echo "==> integration tests"
"${PYTEST[@]}" tests --ignore=tests/unit --ignore=tests/e2e || integration=$?
echo "==> exit status: unit $unit, e2e $e2e, integration $integration"
[[ $unit == 0 && $e2e == 0 && $integration == 0 ]]
