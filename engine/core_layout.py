"""A one-machine service on CPU gives its decode engines cores of their own (``engine.cpu.reserve_decode_cores``).

On a CPU machine every thread of the service competes for the same few cores: the decode engine, whose
step sets every running stream's pace, the prefill engine, the front door (tokenizing, detokenizing,
writing SSE), Ray's processes and the length predictor. Left to the kernel, the decode engine's thread
waits for a core while each of the others takes a little. Plain vLLM's CPU server binds its model worker to
core 0 and keeps the other core for the rest (``core ids=[0]``, ``reserved_cpus=[1]`` in its log). A
``CoreLayout`` does the same for a disaggregated service:

    decode engine threads   the lowest ``decode engines × threads_per_engine`` cores, nothing else on them
    every other thread      the other cores, "the rest": prefill engines, front door, Ray, the workers' event
                            loops, the predictor

``tetriserve serve`` makes the layout when it starts a Ray cluster of its own on a CPU machine and at least
one core stays for the rest, and hands it to the engines' workers in the environment (``LAYOUT_ENV``). The
service starts on every core: on the rest alone, Ray's processes, the workers' imports, the engines' builds
(model load) and the predictors' loads queue on one core while the decode cores, idle until the first
request, wait. On 2 cores ``tetriserve serve`` is ready in a median 47.4 s starting on every core, against
90.0 s starting on the rest (three runs each, ``python benchmarks/diagnostics/serve_startup.py --rounds 3
--variant new= --variant old= --pythonpath old=DIR``, DIR holding 5d8695c, which starts on the rest, laid out
as installed). An engine's thread moves itself to its role's cores when it takes a role (also at a flip).
Once the service is up, ``settle_on_rest`` moves every other thread of the service's processes to the rest;
what starts later (a worker the supervisor restarts, a scaled-out one) inherits the rest from Ray's processes
and builds its engine on every core (``building_on``).

A decode engine first claims a group of ``threads_per_engine`` reserved cores (``CoreClaim``: an exclusive
``flock`` on a file per group, which the OS drops when its process ends), so two decode engines never share
one; with a claim it runs on those cores at niceness 0 and borrows none (its core is its own, and a borrowed
OMP helper thread would start on it). The reservation is sized at start: a decode engine a flip or scaling
adds finds every group claimed and shares every core, with ``decode_niceness`` and borrowing, as without a
layout. At saturation on 2 cores, a decode engine pinned to its core at niceness 0 (the prefill engine on
every core) gives 2423 and 2548 output tokens/s against 2274 and 2302 sharing every core; its step takes 11.3
against 15.1 ms by the wall clock, and its thread waits 3.0 against 5.4 s for a core (``python
benchmarks/diagnostics/engine_steps.py --scenario saturation --repeats 2 --variant default= --variant
'pfp0=--no-borrow-idle-cores --decode-niceness 0' --pin-free-prefill pfp0``).

The prefill engines run on the rest only. On every core a prefill engine takes an equal share of the decode's
core, as a colocated engine spends part of its step on prompt chunks; on the rest a burst's prompts come later
and every decode step sooner. At saturation the rest gives 2764 against 2486 output tokens/s, a decode step of
10.3 against 13.5 ms and a median TPOT of 24.1 against 38.1 ms, for a prefill step of 82.8 against 60.6 ms and
a median TTFT of 3.0 against 2.3 s; at 2 req/s a median TPOT of 2.86 against 3.13 ms and a median TTFT of
41.3 against 37.9 ms (``python benchmarks/diagnostics/engine_steps.py --scenario saturation --repeats 3
--variant every= --variant rest= --code every=58ec87a --code rest=53672ec``, and ``--scenario rate``;
58ec87a runs the prefill engines on every core).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tetriserve.common.config import CpuConfig
from tetriserve.engine.cores import default_board_path, usable_cpus

logger = logging.getLogger(__name__)

LAYOUT_ENV = "TETRISERVE_CORE_LAYOUT"
SHARED_DECODE_NICENESS = -20  # a decode engine on its own cores that others may use (engine.cpu.share_decode_cores)
ENGINE_THREAD_PREFIX = "eng-"  # an engine thread's OS name (/proc/<pid>/task/<tid>/comm), and its helpers'


def cpu_list(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


@dataclass(frozen=True)
class CoreLayout:
    decode: frozenset[int]  # the decode engines' threads, and nothing else
    every: frozenset[int]  # every core the service may use (a decode engine without a claim shares them all)

    @property
    def rest(self) -> frozenset[int]:
        """The cores of every thread but the engines'."""
        return self.every - self.decode

    def to_env(self) -> str:
        return f"{cpu_list(self.decode)};{cpu_list(self.every)}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CoreLayout | None:
        """The layout ``tetriserve serve`` exported, or None (none made, or unreadable)."""
        text = environ.get(LAYOUT_ENV, "")
        if not text:
            return None
        try:
            decode, every = (frozenset(int(c) for c in part.split(",") if c) for part in text.split(";"))
        except ValueError:
            logger.warning("ignoring %s=%r: not '<decode cores>;<every core>'", LAYOUT_ENV, text)
            return None
        if not decode or not every - decode or not decode <= every:
            logger.warning("ignoring %s=%r: the decode cores must be some, not all, of the cores", LAYOUT_ENV, text)
            return None
        return cls(decode, every)


@dataclass(frozen=True)
class RoleCpu:
    """How a role's engine thread runs on the machine's cores (``EngineLoop.take_role``)."""

    niceness: int
    borrows: bool
    cores: frozenset[int] | None  # None: where the process put it

    @classmethod
    def decode(cls, cfg: CpuConfig, layout: CoreLayout | None, claim: CoreClaim | None) -> RoleCpu:
        """With a claim, its own cores, where it has nothing to yield to and nothing to borrow; sharing cores
        (no layout, or no group left to claim), the configured niceness and borrowing."""
        if claim is not None:
            return cls(0 if cfg.share_decode_cores == "none" else SHARED_DECODE_NICENESS, False, claim.cores)
        return cls(cfg.decode_niceness, cfg.borrow_idle_cores, None if layout is None else layout.every)

    @classmethod
    def prefill(cls, cfg: CpuConfig, layout: CoreLayout | None) -> RoleCpu:
        """The rest's cores, at the configured niceness: a prompt never takes a step's time from a decode
        engine's own core."""
        if layout is None:
            return cls(cfg.prefill_niceness, False, None)
        return cls(cfg.prefill_niceness, False, layout.every if cfg.share_decode_cores == "all" else layout.rest)


class CoreClaim:
    """One decode engine's hold on a group of the reserved cores, until ``release`` or its process ends."""

    def __init__(self, fd: int, cores: frozenset[int]) -> None:
        self.cores = cores
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the lock
            self._fd = None


def claim_decode_cores(layout: CoreLayout, threads: int, lock_dir: Path | None = None) -> CoreClaim | None:
    """The first group of ``threads`` reserved cores no other decode engine holds, or None."""
    ordered = sorted(layout.decode)
    base = lock_dir or default_board_path().parent
    for i in range(0, len(ordered) - threads + 1, threads):
        group = ordered[i : i + threads]
        path = base / f"tetriserve-decode-cores-{'-'.join(map(str, group))}.{os.getuid()}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            logger.warning("decode engine shares every core, cannot claim %s: %s", path, exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another decode engine holds them
            os.close(fd)
            continue
        return CoreClaim(fd, frozenset(group))
    return None


def plan_layout(cores: Iterable[int], decode_engines: int, threads_per_engine: int) -> CoreLayout | None:
    """The lowest ``decode_engines × threads_per_engine`` of ``cores`` for the decode engines, if at least one
    core is left for the rest; None otherwise."""
    ordered = sorted(set(cores))
    n = decode_engines * threads_per_engine
    if n < 1 or len(ordered) - n < 1:
        return None
    return CoreLayout(frozenset(ordered[:n]), frozenset(ordered))


def settle_on_rest(layout: CoreLayout) -> int:
    """Once the service is up: every thread of this process and of every process it started (Ray's, the
    workers', the predictors') that is still on every core moves to the rest; engine threads (named
    ``ENGINE_THREAD_PREFIX`` + the worker, on their role's cores even where that is every core) and the helper
    threads they started (which inherit both) stay. Threads and processes
    started later inherit the rest from the thread that starts them. Returns how many threads moved."""
    import psutil

    moved = 0
    for _ in range(2):  # a second pass for threads and processes started while the first ran
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            moved += _settle_threads(proc.pid, layout)
    return moved


def _settle_threads(pid: int, layout: CoreLayout) -> int:
    moved = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0  # the process has just ended
    for task in tasks:
        try:
            if (task / "comm").read_text().startswith(ENGINE_THREAD_PREFIX):
                continue
            tid = int(task.name)
            if os.sched_getaffinity(tid) != layout.every:
                continue  # pinned where it belongs, or moved already
            os.sched_setaffinity(tid, layout.rest)
            moved += 1
        except (OSError, ValueError):
            continue  # a thread that has just ended
    return moved


def reserve_decode_cores(decode_engines: int, threads_per_engine: int) -> CoreLayout | None:
    """At the start of a one-machine service on CPU, before Ray starts: make the layout and export it for the
    workers (``settle_on_rest`` applies it to the rest of the service once it is up). None (and nothing
    changed) on GPUs, off Linux, or where too few cores are usable."""
    from tetriserve.engine.settings import on_cpu

    if not hasattr(os, "sched_setaffinity") or not Path("/proc/self/task").is_dir() or not on_cpu():
        return None
    if usable_cpus() < 2:  # a CPU quota of one core: nothing to reserve
        return None
    layout = plan_layout(os.sched_getaffinity(0), decode_engines, threads_per_engine)
    if layout is None:
        return None
    os.environ[LAYOUT_ENV] = layout.to_env()
    return layout


def pin_engine_thread(cores: frozenset[int] | None) -> None:
    """On the engine thread: run it on ``cores`` (its role's in the layout); None leaves it where it is."""
    if cores is None:
        return
    try:
        os.sched_setaffinity(0, cores)
    except OSError as exc:
        logger.warning("engine thread stays on its cores, could not move to %s: %s", cpu_list(cores), exc)


@contextmanager
def building_on(cores: frozenset[int] | None) -> Iterator[None]:
    """The calling thread on ``cores`` for the block (an engine's build: model load and compile, which would
    otherwise run on the rest, beside the front door), then back where it was; None: nothing moves."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    pin_engine_thread(cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
