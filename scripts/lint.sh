#!/usr/bin/env bash
# The static checks: import contracts, ruff, mypy --strict, the documentation site (mkdocs build --strict: a
# broken link, a missing page or a page left out of the nav fails). `scripts/test.sh` runs them beside the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> import contracts"
.venv/bin/lint-imports
echo "==> ruff"
.venv/bin/ruff check .
echo "==> mypy --strict (common, channel, observability and the policy packages)"
# mypy cannot follow the editable install's import hook, so it reads the folders through a view laid out as
# they install (tetriserve/<folder> -> <folder>)
VIEW=build/typecheck
rm -rf "$VIEW" && mkdir -p "$VIEW/tetriserve"
for d in common channel observability transport engine length_predictor prefill_worker decode_worker worker control_plane frontdoor cli \
    client protos; do
    ln -s "$PWD/$d" "$VIEW/tetriserve/$d"
done
(cd "$VIEW" && MYPYPATH=. ../../.venv/bin/mypy --config-file ../../pyproject.toml --cache-dir ../mypy_cache --explicit-package-bases \
    tetriserve/common tetriserve/channel tetriserve/observability tetriserve/prefill_worker/queue tetriserve/prefill_worker/chunking tetriserve/prefill_worker/dispatch \
    tetriserve/prefill_worker/views.py tetriserve/prefill_worker/policy.py tetriserve/decode_worker/views.py \
    tetriserve/decode_worker/admission tetriserve/decode_worker/preemption tetriserve/decode_worker/policy.py \
    tetriserve/decode_worker/slices.py tetriserve/decode_worker/planner.py tetriserve/prefill_worker/planner.py \
    tetriserve/length_predictor/baseline.py tetriserve/length_predictor/buckets.py \
    tetriserve/length_predictor/padding.py tetriserve/length_predictor/batcher.py tetriserve/length_predictor/oracle.py \
    tetriserve/length_predictor/process.py \
    tetriserve/engine/cores.py tetriserve/control_plane/supervisor.py tetriserve/frontdoor/token_log.py \
    tetriserve/prefill_worker/predictions.py tetriserve/frontdoor/admission.py tetriserve/frontdoor/http_limits.py \
    tetriserve/frontdoor/field_checks.py tetriserve/prefill_worker/pace.py tetriserve/control_plane/flip \
    tetriserve/control_plane/elastic.py tetriserve/frontdoor/key_table.py tetriserve/prefill_worker/decode_peers.py \
    tetriserve/frontdoor/core.py tetriserve/frontdoor/stream_observers.py tetriserve/frontdoor/backend.py)
echo "==> docs (mkdocs build --strict)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir build/site
