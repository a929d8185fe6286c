"""The contract's failure part against a peer in another process, for every backend that crosses processes:
a peer that dies fails the transfer promptly on both sides, a frozen peer fails it at its deadline (and the
next transfer to it, once it is back, goes through on a fresh connection or group).

The peer is a child Python process (``_CHILD``) driven over its stdin/stdout; nothing sleeps to wait for state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.transport_support import poll
from tetriserve.transport.api import TransferState

CROSS_PROCESS = ["tcp", "shm", "ucx", "nccl", "auto"]

_CHILD = """
import sys, time
from tetriserve.transport.registry import make_transport
from tetriserve.transport.api import TransferState
options = {"across_hosts": True, "host": "peer-host"} if sys.argv[1] == "auto" else {}  # another "host": UCX
if sys.argv[1] == "nccl":
    options = {"backend": "gloo"}  # as the test's own endpoints (conftest): two ranks on one GPU fail in NCCL
t = make_transport(sys.argv[1], "127.0.0.1:0", **options)
print(t.address, flush=True)
for line in sys.stdin:
    dst, key, size = line.split()
    if key == "warm":
        print(t.send(dst, key, [b"w"], 30.0).wait(30.0).value, flush=True)
    else:
        t.send(dst, key, [bytearray(int(size))], 60.0)
        print("sending", flush=True)
"""


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start peer processes of a backend (killed at teardown); each prints its address first."""
    started: list[subprocess.Popen[str]] = []

    def _start(kind: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ),
        )  # fmt: skip
        started.append(proc)
        return proc

    yield _start
    for proc in started:
        with_signal(proc, signal.SIGCONT)
        proc.kill()
        proc.wait(10.0)


def with_signal(proc: subprocess.Popen[str], sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` has stopped (a SIGSTOP takes effect as each returns to user space)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt" for t in tasks.iterdir())


def _line(proc: subprocess.Popen[str]) -> str:
    """The peer's next line of output, past UCX's own log lines (UCX logs to stdout: ``[time] [host:pid] ...``)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline().strip()
        assert line, f"peer process exited (rc={proc.poll()})"
        if not line.startswith("["):
            return line


def _tell(proc: subprocess.Popen[str], dst: str, key: str, size: int = 0) -> None:
    assert proc.stdin is not None
    proc.stdin.write(f"{dst} {key} {size}\n")
    proc.stdin.flush()


@pytest.mark.parametrize("kind", CROSS_PROCESS)
def test_a_receiver_that_dies_fails_the_next_send_promptly(make: Callable[..., Any], child: Any, kind: str) -> None:
    peer = child(kind)
    dst = _line(peer)
    tx = make(kind)
    assert tx.send(dst, "warm", [b"x"], 30.0).wait(30.0) is TransferState.DONE  # connection (group) is up
    peer.kill()
    peer.wait(10.0)
    handle = tx.send(dst, "after-death", [bytearray(1 << 20)], deadline_s=30.0)
    assert handle.wait(35.0) is TransferState.FAILED
    assert handle.finished is not None and handle.finished - handle.started < 10.0, "failed only near the deadline"
    assert handle.error is not None and "after-death" in handle.error


@pytest.mark.parametrize("kind", ["tcp", "ucx", "nccl"])  # shm's transfer is one small frame after the copy
def test_a_sender_that_dies_mid_transfer_fails_the_key_on_the_receiver_promptly(
    make: Callable[..., Any], child: Any, kind: str
) -> None:
    rx = make(kind)
    peer = child(kind)
    _line(peer)
    _tell(peer, rx.address, "warm")
    assert _line(peer) == "done"  # the pair (connection, group) is up: what follows is the transfer alone
    _tell(peer, rx.address, "big", 1 << 30)
    assert _line(peer) == "sending"
    time.sleep(0.15)  # let the bytes start flowing (1 GiB takes seconds here); then the sender dies mid-transfer
    peer.kill()
    reason = poll(lambda: rx.failed("big") or (rx.landed("big") and "landed"), 10.0, "the receiver to learn")
    assert reason != "landed", "the whole GiB landed before the kill: the test did not cut the transfer"
    assert "big" in reason


@pytest.mark.parametrize("kind", CROSS_PROCESS)
def test_a_frozen_receiver_fails_the_send_at_its_deadline_and_the_next_one_goes_through(
    make: Callable[..., Any], child: Any, kind: str
) -> None:
    peer = child(kind)
    dst = _line(peer)
    tx = make(kind)
    assert tx.send(dst, "warm", [b"x"], 30.0).wait(30.0) is TransferState.DONE
    with_signal(peer, signal.SIGSTOP)
    poll(lambda: _stopped(peer.pid), 10.0, "the peer to stop")
    try:
        handle = tx.send(dst, "frozen", [bytearray(1 << 20)], deadline_s=1.0)
        assert handle.wait(10.0) is TransferState.FAILED
        assert handle.finished is not None and handle.finished - handle.started < 1.0 + 2.0
    finally:
        with_signal(peer, signal.SIGCONT)
    again = tx.send(dst, "thawed", [b"y" * 1000], deadline_s=30.0)  # a fresh connection (group) to the same peer
    assert again.wait(35.0) is TransferState.DONE, again.error
