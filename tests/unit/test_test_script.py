"""scripts/test.sh, the suite's command (what CI runs), run with its tools stubbed: its exit status is the suite's.

Under `set -e` a failing command in the script's exit trap (a bare `kill` of runs already waited for) would become
its exit status and fail a green suite in CI; these runs check the status and take well under a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# stands in for .venv/bin/python: fails when its arguments contain $FAIL_MATCH
PYTHON_STUB = """#!/usr/bin/env bash
echo "python $*"
if [[ -n "${FAIL_MATCH:-}" && "$*" == *"$FAIL_MATCH"* ]]; then exit 1; fi
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", scripts / "test.sh")
    stubs = {
        scripts / "setup.sh": "#!/usr/bin/env bash\n",
        scripts / "lint.sh": '#!/usr/bin/env bash\necho lint\nexit "${LINT_RC:-0}"\n',
        tmp_path / ".venv" / "bin" / "python": PYTHON_STUB,
    }
    for path, text in stubs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return tmp_path


def run(sandbox: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(sandbox / "scripts" / "test.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_a_green_suite_exits_zero(sandbox: Path) -> None:
    done = run(sandbox)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exit status: unit 0, e2e 0, transport 0, integration 0, static checks 0" in done.stdout


@pytest.mark.parametrize(
    ("fail_match", "named"),
    [
        ("tests/unit --ignore=tests/unit/transport", "unit 1"),
        ("tests/e2e --ignore", "e2e 1"),
        ("-q tests/unit/transport", "transport 1"),
        ("tests --ignore=tests/unit --ignore=tests/e2e", "integration 1"),
    ],
)
def test_a_failing_phase_fails_the_suite_after_every_phase_ran(sandbox: Path, fail_match: str, named: str) -> None:
    done = run(sandbox, FAIL_MATCH=fail_match)
    assert done.returncode != 0
    assert named in done.stdout
    assert "==> integration tests" in done.stdout and "==> static checks" in done.stdout


def test_failing_static_checks_fail_the_suite(sandbox: Path) -> None:
    done = run(sandbox, LINT_RC="3")
    assert done.returncode != 0
    assert "static checks 3" in done.stdout


def test_a_selection_is_one_pytest_run_and_its_status_counts(sandbox: Path) -> None:
    green = run(sandbox, "tests/unit/test_x.py")
    assert green.returncode == 0, green.stdout + green.stderr
    assert green.stdout.count("python -m pytest") == 1
    red = run(sandbox, "tests/unit/test_x.py", FAIL_MATCH="test_x")
    assert red.returncode != 0
    assert "exit status: tests 1, static checks 0" in red.stdout
