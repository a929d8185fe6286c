"""Engines on one machine share its CPU cores: a decode engine steps with the cores idle engines leave.

Disaggregation splits one machine's cores between engines: each CPU engine runs
``engine.threads_per_engine`` OMP threads. A prefill engine is idle between
prompts, and a lone vLLM server would use its cores for decoding then; with a
static split they sit unused (with one stream, and in the tail of a burst once
the prompts are done). So every engine posts on a machine-wide board whether it
is stepping, and a *borrowing* engine (decode engines, ``engine.cpu.borrow_idle_cores``)
steps with its own threads plus the spare ones:

    spare = usable cores − Σ threads of the engines stepping now (itself included)

The spare goes to one borrower only, the stepping borrower in the lowest slot,
so two decode engines never both take it. A borrower re-reads the board before
every step and gives the cores back at its next step once a prefill engine
starts stepping (at most one decode step of overlap; with a decode niceness
above 0, the prompt wins the core meanwhile).

An OMP step runs at the pace of its slowest thread, so a borrowed thread that
the front door or a prompt preempts slows the whole step. So a borrower also
meters the rest of the machine (``CpuMeter``: ``/proc/stat`` busy time less its
own process's, over 200 ms) and borrows only while that has left at least
``engine.cpu.borrow_min_idle_cores`` (default ``MIN_IDLE_CORES``) idle beyond its own
threads: the front door, Ray and the length predictor post nothing on the board
but use cores all the same. Less is worse at saturation: a borrowed thread that
another process preempts holds the step back (on 2 cores, 1992 output tokens/s at
0.5 against 1443 at 0 and 1494 at 0.25, ``python
benchmarks/diagnostics/engine_steps.py --scenario saturation --repeats 2 --variant
default= --variant 'idle0=--borrow-min-idle 0' --variant 'idle25=--borrow-min-idle
0.25'``).

A borrower borrows only for steps of at least ``min_batch`` running requests
(``engine.cpu.borrow_min_batch``, default 4): offline, a second thread cuts a decode
step by 29-57% from a batch of 4 on and buys nothing at a batch of one (``python
benchmarks/diagnostics/engine_executor.py --executors uni --threads 1 2 --batches
1 4 16 64 --tokens 128 --repeats 3``). A borrower below that batch shows on the
board as no borrower, so the spare goes to one that can use it. Borrowing is on
by default: at saturation one pair gives 2233 output tokens/s with it against
1717 without (``python benchmarks/diagnostics/engine_steps.py --scenario
saturation --repeats 1 --variant gated= --variant off=--no-borrow-idle-cores``).
Engines post on the board either way.

The board is a small shared-memory file (``/dev/shm``), one slot per engine:
pid, threads, stepping, borrows. A slot whose process has died is reclaimed, and
borrowers stop counting it within a second, so a killed worker does not pin the
cores. CPU only: on GPUs threads are not what steps an engine.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import math
import mmap
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SLOTS = 64
_FIELDS = 4  # int32 each: pid, threads, stepping, borrows
_PID, _THREADS, _STEPPING, _BORROWS = range(_FIELDS)
_SLOT_BYTES = 4 * _FIELDS
LIVENESS_INTERVAL_S = 1.0
METER_WINDOW_S = 0.2
PR_SET_NAME = 15  # prctl option: the calling thread's name
MIN_IDLE_CORES = 0.5  # borrow only while the rest of the machine has left at least this much idle


def usable_cpus() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (containers)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def default_board_path() -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"tetriserve-cores.{os.getuid()}"


class CoreBoard:
    """The machine-wide board; ``claim`` gives an engine its slot."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_board_path()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < SLOTS * _SLOT_BYTES:
                os.ftruncate(fd, SLOTS * _SLOT_BYTES)
            self._map = mmap.mmap(fd, SLOTS * _SLOT_BYTES)
        finally:
            os.close(fd)
        self._ints = memoryview(self._map).cast("i")

    def claim(self, threads: int, borrows: bool) -> CoreShare:
        with open(self.path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one claim at a time, machine-wide
            for slot in range(SLOTS):
                pid = self._get(slot, _PID)
                if pid == 0 or not _alive(pid):
                    self._set(slot, _STEPPING, 0)
                    self._set(slot, _THREADS, threads)
                    self._set(slot, _BORROWS, int(borrows))
                    self._set(slot, _PID, os.getpid())
                    return CoreShare(self, slot, threads, borrows)
        raise RuntimeError(f"core board {self.path}: all {SLOTS} slots are taken")

    def _get(self, slot: int, field: int) -> int:
        return int(self._ints[slot * _FIELDS + field])

    def _set(self, slot: int, field: int, value: int) -> None:
        self._ints[slot * _FIELDS + field] = value

    def rows(self) -> list[tuple[int, int, int, int]]:
        """(slot, threads, stepping, borrows) of every claimed slot."""
        ints = self._ints
        return [
            (slot, ints[slot * _FIELDS + _THREADS], ints[slot * _FIELDS + _STEPPING], ints[slot * _FIELDS + _BORROWS])
            for slot in range(SLOTS)
            if ints[slot * _FIELDS + _PID]
        ]


class CoreShare:
    """One engine's slot. ``stepping(True)`` before a step; ``threads(batch)`` says how many threads to step with."""

    def __init__(self, board: CoreBoard, slot: int, threads: int, borrows: bool) -> None:
        self.board = board
        self.slot = slot
        self.own = threads
        self.borrows = borrows
        self.min_batch = 0  # a borrower borrows only for steps of at least this many requests (``set_borrows``)
        self.min_idle = MIN_IDLE_CORES  # ... and while the rest of the machine leaves this many cores idle
        self._wants = borrows  # what the board shows: a borrower, whose next step is large enough (``threads``)
        self.cpus = usable_cpus()
        self._stepping = False
        self._dead: set[int] = set()  # slots whose process has died (re-checked every second)
        self._checked = 0.0
        self.meter: CpuMeter | None = CpuMeter() if borrows and CpuMeter.available() else None
        self.release = weakref.finalize(self, _release, board, slot, os.getpid())  # idempotent; also on GC

    def set_borrows(self, borrows: bool, min_batch: int = 0, min_idle: float = MIN_IDLE_CORES) -> None:
        """Become (or stop being) a borrower: the engine's worker changed role."""
        self.min_batch = min_batch
        self.min_idle = min_idle
        if borrows != self.borrows:
            self.borrows = borrows
            self._post(borrows)
            self.meter = CpuMeter() if borrows and CpuMeter.available() else None

    def _post(self, wants: bool) -> None:
        if wants != self._wants:
            self._wants = wants
            self.board._set(self.slot, _BORROWS, int(wants))

    def stepping(self, on: bool) -> None:
        if on != self._stepping:
            self._stepping = on
            self.board._set(self.slot, _STEPPING, int(on))

    def threads(self, batch: int | None = None) -> int:
        """Threads for this engine's next step: its own, plus the spare cores if it is the borrower. ``batch``: the
        requests that step runs; below ``min_batch`` the engine keeps its own threads and, on the board, leaves the
        spare to another borrower (a small step has too little work to split across cores)."""
        wants = self.borrows and (batch is None or batch >= self.min_batch)
        self._post(wants)
        if not wants:
            return self.own
        now = time.monotonic()
        if now - self._checked >= LIVENESS_INTERVAL_S:
            self._checked = now
            self._dead = self._dead_slots()
        in_use = 0
        borrower = None
        for slot, threads, stepping, borrows in self.board.rows():
            if not stepping or slot in self._dead:
                continue
            in_use += threads
            if borrows and borrower is None:
                borrower = slot
        spare = self.cpus - in_use
        if borrower != self.slot or spare <= 0:
            return self.own
        if self.meter is not None and self.meter.others() > self.cpus - self.own - self.min_idle:
            return self.own  # the board's spare core is busy with processes that post nothing (front door, Ray)
        return self.own + spare

    def _dead_slots(self) -> set[int]:
        return {slot for slot in range(SLOTS) if (pid := self.board._get(slot, _PID)) and not _alive(pid)}


class CpuMeter:
    """Cores the rest of the machine kept busy over the last ``window_s``: busy time in ``/proc/stat`` less
    this process's own (``/proc/self/stat``), so a borrower's own threads never count against it. Reads
    ``/proc`` at most once a window."""

    def __init__(
        self,
        window_s: float = METER_WINDOW_S,
        read: Callable[[], tuple[int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._read = read or _read_ticks
        self._clock = clock
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._then = clock()
        self._last = self._read()
        self._others = 0.0

    @staticmethod
    def available() -> bool:
        return Path("/proc/stat").is_file() and Path("/proc/self/stat").is_file()

    def others(self) -> float:
        now = self._clock()
        if now - self._then >= self._window_s:
            machine, own = sample = self._read()
            busy = (machine - self._last[0]) - (own - self._last[1])
            self._others = max(0.0, busy / self._ticks_per_s / (now - self._then))
            self._then, self._last = now, sample
        return self._others


def _read_ticks() -> tuple[int, int]:
    """(the machine's busy clock ticks, this process's busy clock ticks)."""
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    busy = sum(int(cpu[i]) for i in (0, 1, 2, 5, 6, 7) if i < len(cpu))  # user nice system irq softirq steal
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, int(own[11]) + int(own[12])  # utime, stime


def _release(board: CoreBoard, slot: int, pid: int) -> None:
    if board._get(slot, _PID) == pid:
        board._set(slot, _STEPPING, 0)
        board._set(slot, _PID, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def set_engine_threads(threads: int) -> None:
    """Set the calling thread's OMP/torch thread count. vLLM's CPU worker replaces ``torch.set_num_threads``
    with a no-op once it binds threads to cores; tetriserve's engines do not bind (``nobind``), so the
    underlying setter is safe and takes effect from the next parallel region."""
    import torch

    torch._C.set_num_threads(threads)


def claim_cores(threads: int, borrows: bool) -> CoreShare | None:
    """An engine's slot on this machine's board; None on GPUs, or where the board cannot be made."""
    from tetriserve.engine.settings import on_cpu

    if not on_cpu():
        return None
    try:
        return CoreBoard().claim(threads, borrows)
    except (OSError, RuntimeError) as exc:
        logger.warning("engines keep their own threads, no core board: %s", exc)
        return None


def name_os_thread(name: str) -> None:
    """Give the calling thread an OS name (Linux keeps 15 bytes), seen by ``top -H`` and in
    ``/proc/<pid>/task/<tid>/comm``; Python's thread names stay inside the interpreter. Does nothing off Linux."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        logger.debug("could not name thread %s", name)


def set_thread_niceness(niceness: int) -> bool:
    """Give the calling thread, and only it, ``niceness`` (Linux niceness is per thread; the rest of the
    process keeps its own). False where the OS refuses (a lower niceness than the thread has needs CAP_SYS_NICE)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (OSError, AttributeError):
        return False
    return True


def may_raise_priority() -> bool:
    """Whether a thread of this process may take a niceness below 0 (CAP_SYS_NICE, or RLIMIT_NICE allows it);
    tried on a short-lived thread of its own."""
    allowed: list[bool] = []
    probe = threading.Thread(target=lambda: allowed.append(set_thread_niceness(-1)), daemon=True)
    probe.start()
    probe.join()
    return bool(allowed and allowed[0])
