"""How long `tetriserve serve` takes to be ready, and where its threads run once it is.

    python benchmarks/diagnostics/serve_startup.py --rounds 2 --variant default= \\
        [--variant no-layout=--no-reserve-decode-cores] [--pythonpath NAME=DIR] [--out NAME]

Each round starts every variant once, in turn (the order alternating from round to round), as a user does:
``tetriserve serve --grpc-port 0 --http-port 0 --kv-cache-gb 0.5 --enforce-eager <flags>`` with a Ray cluster of
its own and the default tiny model. It reads the ``ready in`` line serve prints, then, before stopping it
(SIGINT, as Ctrl-C), counts the threads of serve's process tree by the cores they may run on, and lists the
engine threads' (``eng-*``, with the helper threads they start; ``engine/core_layout.py``). ``--pythonpath
NAME=DIR`` runs variant NAME with ``PYTHONPATH=DIR`` (another checkout laid out as installed, to time an older
commit in the same run).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS
from thread_timeline import threads

from tetriserve.engine.core_layout import ENGINE_THREAD_PREFIX

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--grpc-port", "0", "--http-port", "0", "--kv-cache-gb", "0.5", "--enforce-eager"]


def threads_by_cores(sid: int) -> tuple[Counter[str], list[str]]:
    """Threads of session ``sid`` (serve's, Ray's processes included) by their CPU affinity; the engine threads'."""
    counts: Counter[str] = Counter()
    engines: list[str] = []
    for tid, (name, _, _) in threads(sid).items():
        try:
            cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(tid)))
        except OSError:
            continue  # a thread that has just ended
        counts[cores] += 1
        if name.startswith(ENGINE_THREAD_PREFIX):
            engines.append(cores)
    return counts, sorted(engines)


def one(flags: list[str], pythonpath: str | None, timeout_s: float = 600) -> tuple[float, Counter[str], list[str]]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "tetriserve.cli.main", "serve", *FLAGS, *flags]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    ready = float("nan")
    deadline = time.monotonic() + timeout_s
    try:
        for line in proc.stdout:
            if m := re.search(r"tetriserve: ready in ([0-9.]+) s", line):
                ready = float(m.group(1))
            if "Ctrl-C stops" in line or time.monotonic() > deadline:
                break
        time.sleep(2)  # the front doors' threads are up
        counts, engines = threads_by_cores(proc.pid)  # its own session (start_new_session)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return ready, counts, engines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME=FLAGS (serve's extra flags)")
    ap.add_argument("--pythonpath", action="append", default=[], help="NAME=DIR: PYTHONPATH for variant NAME")
    ap.add_argument("--out", help="also write the table to <out>.md under benchmarks/_work/diagnostics")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant or ["default="])
    paths = dict(p.split("=", 1) for p in args.pythonpath)
    ready: dict[str, list[float]] = {name: [] for name in variants}
    lines = [f"Command: `python {' '.join(sys.argv)}`", "", "| round | variant | ready in (s) | threads by cores | "
             "engine threads' cores |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            took, counts, engines = one(variants[name].split(), paths.get(name))
            ready[name].append(took)
            by_cores = ", ".join(f"{cores}: {n}" for cores, n in sorted(counts.items()))
            row = f"| {r + 1} | {name} | {took:.1f} | {by_cores} | {'; '.join(engines) or '-'} |"
            print(row, flush=True)
            lines.append(row)
    lines += ["", "| variant | median ready in (s) | runs |", "| --- | --- | --- |"]
    for name, values in ready.items():
        lines.append(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print("\n".join(lines[-len(ready) - 2 :]))
    if args.out:
        (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
