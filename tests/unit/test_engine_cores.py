"""Engines on one machine share its cores (engine/cores.py): a decode engine borrows what idle engines leave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tetriserve.engine import cores
from tetriserve.engine.cores import CoreBoard


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CoreBoard:
    monkeypatch.setattr(cores, "usable_cpus", lambda: 2)
    monkeypatch.setattr(cores.CpuMeter, "available", staticmethod(lambda: False))  # the board alone decides
    return CoreBoard(tmp_path / "board")


def test_decode_borrows_the_idle_prefill_core_and_gives_it_back(board: CoreBoard) -> None:
    prefill = board.claim(1, borrows=False)
    decode = board.claim(1, borrows=True)
    decode.stepping(True)
    assert decode.threads() == 2  # the prefill engine is idle: its core is spare
    prefill.stepping(True)
    assert decode.threads() == 1  # a prompt is being prefilled: back to its own thread
    assert prefill.threads() == 1  # a prefill engine never borrows
    prefill.stepping(False)
    assert decode.threads() == 2


def test_only_one_borrower_takes_the_spare(board: CoreBoard) -> None:
    first, second = board.claim(1, borrows=True), board.claim(1, borrows=True)
    lone = CoreBoard(board.path).claim(1, borrows=False)  # another process's view of the same file
    first.stepping(True)
    second.stepping(True)
    assert (first.threads(), second.threads()) == (1, 1)  # 2 cores, 2 stepping engines: nothing spare
    lone.release()
    second.stepping(False)
    assert first.threads() == 2
    first.stepping(False)
    second.stepping(True)
    assert second.threads() == 2


def test_a_small_batch_keeps_its_own_threads_and_leaves_the_spare_to_another_borrower(board: CoreBoard) -> None:
    small, large = board.claim(1, borrows=True), CoreBoard(board.path).claim(1, borrows=True)
    for share in (small, large):
        share.cpus = 3
        share.set_borrows(True, min_batch=16)
    small.stepping(True)
    assert small.threads(batch=16) == 3  # one engine stepping on 3 cores: it takes both spare ones
    assert small.threads(batch=4) == 1  # too little work to split: its own thread only
    large.stepping(True)
    assert large.threads(batch=64) == 2  # the borrower in the lower slot stands aside at its small batch
    assert small.threads(batch=32) == 2  # large enough again: the lower slot is the borrower ...
    assert large.threads(batch=64) == 1  # ... and the spare goes to one borrower only
    assert small.threads() == 2  # no batch given: no gate


def test_more_own_threads_than_cores_is_never_cut(board: CoreBoard) -> None:
    big = board.claim(4, borrows=True)
    big.stepping(True)
    assert big.threads() == 4


def test_a_released_or_dead_engines_slot_is_reclaimed_and_not_counted(board: CoreBoard) -> None:
    decode = board.claim(1, borrows=True)
    prefill = board.claim(1, borrows=False)
    prefill.stepping(True)
    decode.stepping(True)
    assert decode.threads() == 1
    prefill.release()
    assert decode.threads() == 2
    assert board.claim(1, borrows=False).slot == prefill.slot

    # a killed worker leaves its slot marked "stepping" with a pid that no longer runs
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for field, value in ((cores._PID, int(exited.stdout)), (cores._THREADS, 1), (cores._STEPPING, 1)):
        board._set(7, field, value)
    survivor = board.claim(1, borrows=True)
    survivor.stepping(True)
    decode.stepping(False)
    assert survivor.threads() == 2  # the dead engine's core is spare
    claims = [board.claim(1, borrows=False) for _ in range(8)]
    assert 7 in {c.slot for c in claims}  # and its slot is claimed again


def test_usable_cpus_is_at_least_one_and_at_most_the_affinity() -> None:
    n = cores.usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))


class _FakeProc:
    """A clock and /proc counters the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.machine = 0
        self.own = 0

    def advance(self, seconds: float, machine_cores: float, own_cores: float) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        self.now += seconds
        self.machine += round(machine_cores * seconds * tick)
        self.own += round(own_cores * seconds * tick)


def test_cpu_meter_counts_the_rest_of_the_machine_not_this_process() -> None:
    proc = _FakeProc()
    meter = cores.CpuMeter(0.2, read=lambda: (proc.machine, proc.own), clock=lambda: proc.now)
    proc.advance(0.2, machine_cores=1.8, own_cores=1.5)  # we ran 1.5 cores, someone else 0.3
    assert meter.others() == pytest.approx(0.3, abs=0.05)
    proc.advance(0.1, machine_cores=2.0, own_cores=0.0)  # within the window: the last figure stands
    assert meter.others() == pytest.approx(0.3, abs=0.05)
    proc.advance(0.1, machine_cores=2.0, own_cores=0.0)
    assert meter.others() == pytest.approx(2.0, abs=0.05)


def test_a_borrower_takes_no_core_the_rest_of_the_machine_is_using(board: CoreBoard) -> None:
    proc = _FakeProc()
    decode = board.claim(1, borrows=True)
    decode.meter = cores.CpuMeter(0.2, read=lambda: (proc.machine, proc.own), clock=lambda: proc.now)
    decode.stepping(True)
    proc.advance(0.2, machine_cores=1.2, own_cores=1.0)  # the front door and Ray: 0.2 of a core
    assert decode.threads() == 2
    proc.advance(0.2, machine_cores=1.9, own_cores=1.0)  # they now keep most of the spare core busy
    assert decode.threads() == 1


def test_the_idle_a_borrower_leaves_the_rest_of_the_machine_is_a_setting(board: CoreBoard) -> None:
    proc = _FakeProc()
    strict, lax = board.claim(1, borrows=True), CoreBoard(board.path).claim(1, borrows=True)
    lax.set_borrows(True, min_batch=1, min_idle=0.0)
    assert (strict.min_idle, lax.min_idle) == (cores.MIN_IDLE_CORES, 0.0)
    for share in (strict, lax):
        share.meter = cores.CpuMeter(0.2, read=lambda: (proc.machine, proc.own), clock=lambda: proc.now)
    proc.advance(0.2, machine_cores=1.8, own_cores=1.0)  # the rest of the machine keeps 0.8 of a core busy
    strict.stepping(True)
    assert strict.threads() == 1  # less than half a core idle beyond its own: it keeps its own thread
    strict.stepping(False)
    lax.stepping(True)
    assert lax.threads() == 2  # asked to leave nothing idle: it borrows the core all the same
