"""Where benchmark results go, and what every result records about its run.

A suite benchmark writes ``benchmarks/results/<name>.md`` (with ``.json`` and ``.png`` beside it), replacing what
was there. Every report starts with ``provenance``: the exact command, the machine (CPU model, cores), the commit
measured and the date, so a result file says on its own what made it. ``TETRISERVE_BENCH_RESULTS`` moves the
results folder (the probes in ``benchmarks/diagnostics/`` set it to ``benchmarks/_work/diagnostics``: their
reports are not kept).

``measure_or_reload`` keeps a micro-benchmark's result with its run's facts (``<name>.json``) and writes the
Markdown report from it; ``gpu_args`` is the shared command line of the GPU benchmarks, which say so and write
nothing where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("TETRISERVE_BENCH_RESULTS") or ROOT / "benchmarks" / "results")
WORK = ROOT / "benchmarks" / "_work"


def code_state() -> str:
    """The commit the working tree is on, and whether tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return f"{head.stdout.strip() or 'unknown'}{' with uncommitted changes' if dirty.stdout.strip() else ''}"


def machine() -> str:
    """The CPU model and core count (and whether the CPU multiplies bfloat16 in hardware, which decides the
    engines' default dtype), e.g. ``AMD EPYC, 2 cores, bfloat16 in hardware``."""
    model, flags = "unknown CPU", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    bf16 = "bfloat16 in hardware" if flags & {"avx512_bf16", "amx_bf16"} else "no bfloat16 in hardware"
    return f"{model}, {os.cpu_count() or 1} cores, {bf16}"


def command_line() -> str:
    """The command that is running, as a user types it from the repository root: ``python`` and the script's
    path (``benchmarks/...``), then the arguments as given."""
    script = Path(sys.argv[0]).resolve()
    path = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(path), *sys.argv[1:]])


def run_facts() -> dict[str, str]:
    """What a result records about its run: the command (``command_line``), the machine, the commit and the
    date (UTC). Taken when the run starts."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {"command": command_line(), "machine": machine(), "commit": code_state(), "date": now}


def provenance(facts: dict[str, Any]) -> list[str]:
    """A report's first lines after its title: the facts of ``run_facts``, each a Markdown line of its own."""
    return [
        f"Command: `{facts.get('command', 'not recorded')}`  ",
        f"Machine: {facts.get('machine', 'not recorded')}  ",
        f"Commit: {facts.get('commit', 'not recorded')}  ",
        f"Date: {facts.get('date', 'not recorded')}  ",
    ]


def shown(path: Path) -> str:
    """``path`` as a command line shows it: relative to the repository root when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def stamp(md: Path, facts: dict[str, Any], replace_prefix: str | None = None) -> None:
    """Put ``provenance(facts)`` after the title of a report another program wrote (``tetriserve profile``,
    ``tetriserve predictor eval``); a line of it that starts with ``replace_prefix`` (its own ``Command:``) is
    renamed ``Runs:``, so the report has one command, the one that made it."""
    lines = md.read_text().splitlines()
    if replace_prefix is not None:
        lines = ["Runs:" + ln[len("Command:") :] if ln.startswith(replace_prefix) else ln for ln in lines]
    head, rest = (lines[:1], lines[1:]) if lines and lines[0].startswith("# ") else ([], lines)
    md.write_text("\n".join([*head, "", *provenance(facts), *rest]) + "\n")


def run_cli(args: list[str], env: dict[str, str] | None = None) -> int:
    """``tetriserve <args>`` from the repository root, in this interpreter, its output shown as it comes."""
    cmd = [sys.executable, "-m", "tetriserve.cli.main", *args]
    print("$ tetriserve " + shlex.join(args), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **(env or {}))).returncode


def gpu_args(doc: str, name: str) -> argparse.Namespace | None:
    """The command line of a GPU benchmark (``--sizes-mib``, ``--repeats``, ``--report-only``), or None, said
    aloud, when there is nothing to measure on: no CUDA device and no ``--report-only``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    if not args.report_only and not cuda_available():
        print(f"{name}: needs a CUDA GPU and sees none; nothing measured, nothing written")
        return None
    return args


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measure_or_reload(
    name: str,
    report_only: bool,
    measure: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> int:
    """Run ``measure`` and save its result with the run's facts (``run_facts``) as ``<RESULTS>/<name>.json``, or
    with ``report_only`` read the saved one; then write and print the report ``<name>.md``."""
    out = RESULTS / f"{name}.json"
    if report_only:
        data = json.loads(out.read_text())
    else:
        WORK.mkdir(parents=True, exist_ok=True)
        data = {**run_facts(), **measure()}
    return write_result(RESULTS / name, data, report)


def write_result(
    stem: Path,
    data: dict[str, Any],
    report: Callable[[dict[str, Any]], str],
    echo: bool = True,
    plot: Callable[[dict[str, Any], Path], None] | None = None,
) -> int:
    """Write ``data`` as ``<stem>.json`` and its report as ``<stem>.md`` (a bare name lies in ``RESULTS``), and
    with ``plot`` its figure as ``<stem>.png``; print the report (``echo``); 0, a benchmark's exit status."""
    if not stem.is_absolute() and stem.parent == Path("."):
        stem = RESULTS / stem
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    md = report(data)
    stem.with_suffix(".md").write_text(md)
    if plot is not None:
        plot(data, stem.with_suffix(".png"))
    if echo:
        print(md)
    return 0
