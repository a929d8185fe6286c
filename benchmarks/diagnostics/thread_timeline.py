"""Threads of a served tetriserve, read from ``/proc``: who ran, who waited for a core, and what else used the
machine meanwhile (used by ``engine_steps.py`` and ``engine_profile.py``).

``threads`` reads every thread of the server's session (OS name, schedstat, process); ``engine_threads`` finds
each engine's stepping thread in such a reading; ``Timeline`` samples them every ``SAMPLE_S`` during a scenario
and, with the session id, the CPU time of every other thread and process on the machine; ``competitors`` turns
that last part into a report section.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_serve import all_processes, cpu_seconds, label_of, session_processes

SAMPLE_S = 0.5  # the schedstat timeline's interval
COMPETITORS = 12  # threads and processes listed by the cores they used in an engine thread's busy samples
BUSY = 0.5  # a sample counts as busy where the thread ran or waited for a core at least this share of it


def threads(sid: int) -> dict[int, tuple[str, list[int], int]]:
    """tid -> (OS thread name, schedstat: ns on CPU, ns runnable waiting for a core, time slices; its process's
    pid) of every thread of session ``sid``."""
    out = {}
    for proc, _ in session_processes(sid):
        for task in (proc / "task").glob("[0-9]*"):
            try:
                name = (task / "comm").read_text().strip()
                out[int(task.name)] = (name, [int(x) for x in (task / "schedstat").read_text().split()], int(proc.name))
            except OSError:
                continue
    return out


def engine_threads(reading: dict[int, tuple[str, list[int], int]]) -> dict[int, str]:
    """tid -> name of each engine's stepping thread (``eng-<worker>``) in a ``threads`` reading. The OpenMP
    threads an engine starts when it borrows cores inherit its name; the stepping thread is the one that ran
    longest."""
    best: dict[str, tuple[int, int]] = {}
    for tid, (name, stat, _) in reading.items():
        if name.startswith("eng-") and stat[0] >= best.get(name, (0, -1))[1]:
            best[name] = (tid, stat[0])
    return {tid: name for name, (tid, _) in best.items()}


def peers_cpu_s(tid: int, before: dict, after: dict) -> float:
    """CPU seconds the threads of thread ``tid``'s process other than engine threads ran between two ``threads``
    readings (a thread started in between counts from 0): for an engine thread, its worker actor's event loop,
    Ray's threads and the rest, which share its process's interpreter lock."""
    pid = after[tid][2]
    return sum(
        (stat[0] - (before[t][1][0] if t in before else 0)) / 1e9
        for t, (name, stat, p) in after.items()
        if p == pid and not name.startswith("eng-")
    )


class Timeline:
    """Every ``SAMPLE_S``, the schedstat of the given threads (tid -> name), in a background thread; with ``sid``,
    also the CPU time of every thread of that session and of every other process on the machine (the
    benchmark client included), to tell what ran while an engine thread waited for a core."""

    def __init__(self, tids: dict[int, str], sid: int | None = None) -> None:
        self.tids = tids
        self.sid = sid
        self.samples: list[tuple[float, dict[int, tuple[int, int]], dict[str, float]]] = []
        self._labels: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now, row = time.monotonic(), {}
            for tid in self.tids:
                try:
                    run, wait, _ = (int(x) for x in Path(f"/proc/{tid}/schedstat").read_text().split())
                    row[tid] = (run, wait)
                except OSError:
                    continue
            self.samples.append((now, row, self._machine() if self.sid is not None else {}))
            self._stop.wait(SAMPLE_S)

    def _machine(self) -> dict[str, float]:
        """CPU seconds so far by competitor: each thread of the server's session, named ``<process>/<thread>``
        (a worker's process by its engine, ``eng-<worker>``; an engine's OpenMP helpers, which carry its name,
        apart from its stepping thread; threads of one name summed, so one that exits between two samples
        counts 0 there), and every other process by its command line."""
        out: dict[str, float] = {}
        server = threads(self.sid)
        procs: dict[int, str] = {}
        for _, (name, _, pid) in server.items():
            if name.startswith("eng-"):
                procs[pid] = name.removeprefix("eng-") + " worker"
        for tid, (name, stat, pid) in server.items():
            where = procs.get(pid) or self._label(pid)
            what = name if tid not in self.tids else f"{name} (stepping)"
            key = f"{where}/{what}"
            out[key] = out.get(key, 0.0) + stat[0] / 1e9
        pids = {pid for _, _, pid in server.values()}
        for proc, fields in all_processes():
            pid = int(proc.name)
            if pid in pids or pid == os.getpid():
                continue
            key = self._label(pid)
            out[key] = out.get(key, 0.0) + cpu_seconds(fields)
        return out

    def _label(self, pid: int) -> str:
        if pid not in self._labels:
            self._labels[pid] = label_of(Path(f"/proc/{pid}")) or "?"
        return self._labels[pid]

    def stop(self) -> dict[str, dict[str, Any]]:
        """Per thread name: busy samples, the median shares of run, runqueue wait and blocked over them, and
        (with ``sid``) the mean cores each competitor used in them, the largest ``COMPETITORS``."""
        self._stop.set()
        self._thread.join()
        out: dict[str, dict[str, Any]] = {}
        for tid, name in self.tids.items():
            shares, used = [], []
            for (t0, a, ma), (t1, b, mb) in itertools.pairwise(self.samples):
                if tid in a and tid in b:
                    span = (t1 - t0) * 1e9
                    run, wait = (b[tid][0] - a[tid][0]) / span, (b[tid][1] - a[tid][1]) / span
                    if run + wait >= BUSY:
                        shares.append((run, wait, max(0.0, 1 - run - wait)))
                        used.append({k: max(0.0, v - ma.get(k, v)) * 1e9 / span for k, v in mb.items()})
            if shares:
                out[name] = {
                    "busy_samples": float(len(shares)),
                    "busy_run_share": statistics.median(s[0] for s in shares),
                    "busy_wait_share": statistics.median(s[1] for s in shares),
                    "busy_blocked_share": statistics.median(s[2] for s in shares),
                }
                if self.sid is not None:
                    mean = {k: sum(u.get(k, 0.0) for u in used) / len(used) for k in {k for u in used for k in u}}
                    top = sorted(mean.items(), key=lambda kv: -kv[1])[:COMPETITORS]
                    out[name]["busy_cores"] = {"all": sum(mean.values()), **dict(top)}
        return out


def competitors(runs: dict[str, list[dict]]) -> list[str]:
    """``--who``'s section: per variant and engine thread, the cores each competitor used in the thread's busy
    samples (median over the repeats where the thread had any, each repeat's after it), largest first."""
    lines: list[str] = []
    for n, rs in runs.items():
        for tname in sorted({t for r in rs for t, v in r["threads"].items() if "busy_cores" in v}):
            per = [r["threads"][tname]["busy_cores"] for r in rs if "busy_cores" in r["threads"].get(tname, {})]
            keys = sorted({k for p in per for k in p}, key=lambda k: -statistics.median(p.get(k, 0.0) for p in per))
            lines += ["", f"### `{n}`: what used the cores while `{tname}` was busy", ""]
            lines += ["| thread or process | cores |", "| --- | ---: |"]
            for k in keys:
                vals = [p.get(k, 0.0) for p in per]
                cell = f"{statistics.median(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)})"
                lines.append(f"| {k} | {cell} |")
    if lines:
        lines = [
            "",
            "## What used the cores while each engine thread was busy (`--who`)",
            "",
            f"Mean cores over the engine thread's busy samples: `all` is the whole machine; the {COMPETITORS} "
            "largest users of each repeat follow (a server thread as `<process>/<thread>`, a worker's process "
            "by its engine; every other process by its command line). Other processes' CPU time comes in clock "
            "ticks (`/proc/<pid>/stat`), so over few busy samples `all` can read above the machine's cores.",
            *lines,
        ]
    return lines
