"""Running the `tetriserve` command as a user does, for the e2e tests: a process, its output lines as they come."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "tetriserve.cli.main"]


def start(args: list[str], until: str, timeout_s: float) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``tetriserve <args>`` in its own session; return once a line matching ``until`` is out. Its lines
    keep coming into the returned list (a reader thread: a full pipe would block the process)."""
    proc = subprocess.Popen(
        [*CLI, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(until, line):
            break
    stream = proc.stdout
    threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True).start()
    return proc, lines


def field(lines: list[str], pattern: str) -> str:
    """The first group of the last line matching ``pattern`` (fails with the output's tail when none does)."""
    found = [m.group(1) for line in lines if (m := re.search(pattern, line))]
    assert found, "".join(lines[-40:])
    return found[-1]
