"""Policies and planners are given the time; they never read a clock or sleep, so a test, a simulated engine or
a replayed trace drives them with a clock of its own (docs/design/policy-seam.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the policy packages and the planners, which take ``now`` (or a state holding it) as an argument
TIMELESS = [
    "decode_worker/admission",
    "decode_worker/preemption",
    "decode_worker/planner.py",
    "decode_worker/slices.py",
    "decode_worker/views.py",
    "decode_worker/policy.py",
    "prefill_worker/queue",
    "prefill_worker/chunking",
    "prefill_worker/dispatch",
    "prefill_worker/planner.py",
    "prefill_worker/views.py",
    "prefill_worker/policy.py",
    "prefill_worker/pace.py",
    "control_plane/flip",
    "control_plane/elastic.py",
    "frontdoor/admission.py",
    "common/cost_model.py",
    "common/sola_state.py",
    "common/sola_strategy.py",
    "common/scls_estimators.py",
]
CLOCKS = {"time", "datetime"}


def _modules() -> list[Path]:
    found: list[Path] = []
    for entry in TIMELESS:
        path = ROOT / entry
        assert path.exists(), f"{entry} is listed but does not exist"
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def _clock_uses(tree: ast.AST) -> list[str]:
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in CLOCKS]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.split(".")[0] in CLOCKS:
                uses.append(f"from {node.module} import ...")
            elif node.module == "asyncio" and any(a.name == "sleep" for a in node.names):
                uses.append("from asyncio import sleep")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "sleep"
            and isinstance(node.value, ast.Name)
            and node.value.id in ("asyncio", "time")
        ):
            uses.append(f"{node.value.id}.sleep")
    return uses


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_policy_or_planner_reads_no_clock(path: Path) -> None:
    uses = _clock_uses(ast.parse(path.read_text(), str(path)))
    assert not uses, f"{path.relative_to(ROOT)}: {uses}: take the time as an argument instead"


def test_the_check_sees_each_way_of_reaching_a_clock() -> None:
    source = "import time\nfrom datetime import datetime\nfrom asyncio import sleep\nimport asyncio\nasyncio.sleep(1)\n"
    assert _clock_uses(ast.parse(source)) == [
        "import time",
        "from datetime import ...",
        "from asyncio import sleep",
        "asyncio.sleep",
    ]
