#!/usr/bin/env bash
# The transport's unit tests again and again, each run in a fresh process with Python's faulthandler, until one dies
# of a signal (a crash, not a test failure, such as a segfault in UCX); its core is kept in DIR.
#   benchmarks/diagnostics/transport_tests_loop.sh RUNS DIR      (two side by side: run it twice with two DIRs)
set -u
runs=${1:-10} dir=${2:-/tmp/transport_loop}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
ulimit -c unlimited
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    (cd "$dir" && "$root/.venv/bin/python" -X faulthandler -m pytest -q -p no:cacheprovider --rootdir "$root" \
        -c "$root/pyproject.toml" "$root/tests/unit/transport" >"$dir/run_$i.log" 2>&1)
    rc=$?
    echo "run $i rc=$rc $(($(date +%s) - start))s $(tail -1 "$dir/run_$i.log" | cut -c1-80)"
    if [[ $rc -gt 1 ]]; then echo "crashed in run $i"; break; fi
done
