#!/usr/bin/env bash
# The static checks: import contracts, ruff, mypy --strict, the documentation site (mkdocs build --strict: a
# broken link, a missing page or a page left out of the nav fails). `scripts/test.sh` runs them beside the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> import contracts"
.venv/bin/lint-imports
echo "==> ruff"
.venv/bin/ruff check .
echo "==> mypy --strict (every production package)"
# mypy cannot follow the editable install's import hook, so it reads the folders through a view laid out as
# they install (tetriserve/<folder> -> <folder>)
VIEW=build/typecheck
PACKAGES=(common channel observability transport engine length_predictor prefill_worker decode_worker worker control_plane
    frontdoor cli client)
rm -rf "$VIEW" && mkdir -p "$VIEW/tetriserve"
for d in "${PACKAGES[@]}" protos; do
    ln -s "$PWD/$d" "$VIEW/tetriserve/$d"
done
(cd "$VIEW" && MYPYPATH=. ../../.venv/bin/mypy --config-file ../../pyproject.toml --cache-dir ../mypy_cache --explicit-package-bases \
    "${PACKAGES[@]/#/tetriserve/}")
echo "==> docs (mkdocs build --strict)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir build/site
