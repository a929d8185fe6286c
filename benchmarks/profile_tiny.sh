#!/usr/bin/env bash
# Reproduces the tiny model's committed cost profile (SOLA eq. 3/4 fit, AccelGen pivot S_pf / T̄_pf):
#   benchmarks/results/profile_tiny_cpu.{json,png,md}
# One in-process vLLM engine, compiled (not --enforce-eager), one OMP thread; about 3 minutes on a 2-core machine.
# The profile's hardware string is detected (CPU model and core count); the prefill workers look for
# $TETRISERVE_HOME/profiles/tiny-llama--<hardware>.json, so copy the JSON there (or pass --cost-profile) to use it.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
.venv/bin/tetriserve profile --out benchmarks/results/profile_tiny_cpu.json --threads 1
