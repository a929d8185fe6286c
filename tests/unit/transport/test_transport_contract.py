"""Tests for the two-sided transport contract (TCP, shared-memory and in-process backends) and the receive store.

Every backend is driven through the same contract (parametrized ``pair``, see
``conftest.py``). Nothing sleeps to wait for state: ``_poll`` retries with a deadline.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.transport_support import poll as _poll
from tests.transport_support import recv_within as _recv
from tests.unit.transport.conftest import SOCKET_BACKENDS
from tetriserve.transport import store as store_mod
from tetriserve.transport.api import TransferState
from tetriserve.transport.store import ReceiveStore

# -- the two-sided contract, both backends ----------------------------------------------------------


def test_round_trip_mixed_buffers(pair: tuple[Any, Any]) -> None:
    tx, rx = pair
    rng = random.Random(0)
    array = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB, 2-D
    buffers = [
        b"header",
        b"",
        bytearray(rng.randbytes(3 << 20)),
        memoryview(rng.randbytes(1000)),
        memoryview(array),
        bytearray(),
        rng.randbytes(4 << 20),
    ]
    expected = [bytes(b) if not isinstance(b, memoryview) else b.tobytes() for b in buffers]

    assert rx.recv("k") is None
    handle = tx.send(rx.address, "k", buffers, deadline_s=10.0)
    assert handle.key == "k"
    assert handle.nbytes == sum(len(e) for e in expected)
    got = _recv(rx, "k")

    assert handle.wait(10.0) is TransferState.DONE, handle.error
    assert handle.error is None and handle.finished is not None and handle.finished >= handle.started
    views = [memoryview(b) for b in got]  # the contract: writable, one-dimensional unsigned bytes, in order
    assert all(isinstance(b, bytearray | memoryview) for b in got)
    assert all(not v.readonly and v.ndim == 1 and v.format == "B" for v in views)
    assert [bytes(b) for b in got] == expected
    assert np.array_equal(np.frombuffer(got[4], dtype=np.float32).reshape(512, 1024), array)


def test_only_empty_buffers_and_no_buffers(pair: tuple[Any, Any]) -> None:
    tx, rx = pair
    assert tx.send(rx.address, "empty", [b"", b""], 5.0).wait(5.0) is TransferState.DONE
    assert tx.send(rx.address, "none", [], 5.0).wait(5.0) is TransferState.DONE
    assert _recv(rx, "empty") == [bytearray(), bytearray()]
    assert _recv(rx, "none") == []


def test_recv_is_none_before_arrival_and_key_is_taken_once(pair: tuple[Any, Any]) -> None:
    tx, rx = pair
    assert rx.recv("a") is None
    assert rx.recv("a") is None  # asking does not create anything
    tx.send(rx.address, "a", [b"first"], 5.0)
    tx.send(rx.address, "b", [b"second"], 5.0)
    assert _recv(rx, "a") == [bytearray(b"first")]
    assert rx.recv("a") is None
    assert _recv(rx, "b") == [bytearray(b"second")]
    assert rx.recv("b") is None
    assert rx.stats().transfers_received == 2


def test_landed_says_whether_recv_would_return_without_taking(pair: tuple[Any, Any]) -> None:
    tx, rx = pair
    assert rx.landed("k") is False
    assert tx.send(rx.address, "k", [b"payload"], 5.0).wait(5.0) is TransferState.DONE
    assert rx.landed("k") is True
    assert rx.landed("k") is True  # asking takes nothing
    assert rx.recv("k") == [bytearray(b"payload")]
    assert rx.landed("k") is False
    rx.hold("parked", [b"local"])
    assert rx.landed("parked") is True


def test_discard_before_arrival_drops_the_late_data(pair: tuple[Any, Any], kind: str) -> None:
    tx, rx = pair
    assert rx.discard("late") is False  # nothing there yet: remembered as discarded
    handle = tx.send(rx.address, "late", [b"x" * 1000], 5.0)
    state = handle.wait(5.0)
    assert rx.recv("late") is None
    assert rx.stats().transfers_received == 0
    assert rx.stats().bytes_received == 0
    if kind in SOCKET_BACKENDS:  # the receiver acknowledges the drop; the sender learns of it
        assert state is TransferState.FAILED
        assert handle.error is not None and "discarded" in handle.error and "late" in handle.error


def test_discard_after_arrival(pair: tuple[Any, Any]) -> None:
    tx, rx = pair
    handle = tx.send(rx.address, "k", [b"payload"], 5.0)
    assert handle.wait(5.0) is TransferState.DONE  # DONE means stored on the receiver
    assert rx.discard("k") is True
    assert rx.recv("k") is None
    # a different key is unaffected
    tx.send(rx.address, "other", [b"keep"], 5.0)
    assert _recv(rx, "other") == [bytearray(b"keep")]


def test_concurrent_sends_from_many_threads_land_intact(make: Callable[..., Any], kind: str) -> None:
    rx = make(kind)
    senders = [make(kind), make(kind)]
    threads, per_thread = 8, 12
    sent: dict[str, tuple[str, str]] = {}
    handles = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(tid: int) -> None:
        try:
            rng = random.Random(tid)
            tx = senders[tid % len(senders)]
            for i in range(per_thread):
                key = f"t{tid}-r{i}"
                bufs = [rng.randbytes(rng.randrange(0, 200_000)), rng.randbytes(rng.randrange(0, 5000))]
                digest = (hashlib.sha256(bufs[0]).hexdigest(), hashlib.sha256(bufs[1]).hexdigest())
                h = tx.send(rx.address, key, bufs, 20.0)
                with lock:
                    sent[key] = digest
                    handles.append(h)
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30.0)
    assert not errors
    assert len(sent) == threads * per_thread
    for h in handles:
        assert h.wait(20.0) is TransferState.DONE, h.error
    for key, digest in sent.items():
        got = _recv(rx, key)
        assert tuple(hashlib.sha256(b).hexdigest() for b in got) == digest
    stats = rx.stats()
    assert stats.transfers_received == threads * per_thread
    assert stats.bytes_received == sum(h.nbytes for h in handles)
    assert sum(s.stats().transfers_sent for s in senders) == threads * per_thread


def test_stats_counters(pair: tuple[Any, Any], kind: str, dead_port: str) -> None:
    tx, rx = pair
    sizes = [10, 0, 70_000]
    for i, n in enumerate(sizes):
        assert tx.send(rx.address, f"k{i}", [b"a" * n, b"bc"], 5.0).wait(5.0) is TransferState.DONE
    total = sum(sizes) + 2 * len(sizes)
    s, r = tx.stats(), rx.stats()
    assert (s.bytes_sent, s.transfers_sent, s.transfers_failed) == (total, 3, 0)
    assert (r.bytes_received, r.transfers_received, r.expired) == (total, 3, 0)
    assert (s.bytes_received, s.transfers_received) == (0, 0)
    assert (r.bytes_sent, r.transfers_sent) == (0, 0)
    assert s.seconds_sending > 0 and s.send_gbps == pytest.approx(total / s.seconds_sending / 1e9)  # for GB/s
    assert r.seconds_sending == 0 and r.send_gbps == 0

    nowhere = dead_port if kind in SOCKET_BACKENDS else "inproc://nobody-home"
    assert tx.send(nowhere, "lost", [b"x"], 1.0).wait(5.0) is TransferState.FAILED
    after = tx.stats()
    assert (after.bytes_sent, after.transfers_sent, after.transfers_failed) == (total, 3, 1)


# -- the receive store --------------------------------------------------------------------------------


class _ShiftedClock:
    """Stands in for ``transport.store.time``: the real monotonic clock plus an adjustable offset."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


def test_store_ttl_expiry_with_tiny_ttl() -> None:
    store = ReceiveStore(ttl_s=0.01)
    assert store.put("old", [bytearray(b"stale")]) is True
    ticks = itertools.count()
    # expiry runs when something lands: keep landing ticks until "old" has aged out (polled, with a deadline)
    _poll(lambda: store.put(f"tick{next(ticks)}", []) and store.expired >= 1 and "old", 5.0, "old to expire")
    assert store.take("old") is None
    assert store.expired >= 1
    assert store.bytes_received == 5  # counters record what landed, expiry does not rewrite history


def test_store_ttl_expiry_via_transports(make: Callable[..., Any], kind: str) -> None:
    tx, rx = make(kind), make(kind, ttl_s=0.01)
    assert tx.send(rx.address, "orphan", [b"x" * 100], 5.0).wait(5.0) is TransferState.DONE
    ticks = itertools.count()

    def expired() -> bool:
        assert tx.send(rx.address, f"tick{next(ticks)}", [], 5.0).wait(5.0) is TransferState.DONE
        return rx.stats().expired >= 1

    _poll(expired, 5.0, "the orphaned transfer to expire")
    assert rx.recv("orphan") is None


def test_store_discard_marker_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _ShiftedClock()
    monkeypatch.setattr(store_mod, "time", clock)
    store = ReceiveStore(ttl_s=10.0)
    assert store.discard("k") is False
    assert store.put("k", [bytearray(b"late")]) is False  # dropped: discarded beforehand
    assert store.discard("k2") is False
    clock.offset = 11.0  # the discard of k2 is older than the TTL
    assert store.put("k2", [bytearray(b"much later")]) is True
    assert store.take("k2") == [bytearray(b"much later")]


def test_store_entries_within_ttl_survive(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _ShiftedClock()
    monkeypatch.setattr(store_mod, "time", clock)
    store = ReceiveStore(ttl_s=10.0)
    store.put("a", [bytearray(b"1")])
    clock.offset = 9.0  # younger than the TTL
    store.put("b", [bytearray(b"2")])
    assert len(store) == 2 and store.expired == 0
    assert store.take("a") == [bytearray(b"1")]
    clock.offset = 20.0  # "b" (landed at 9) is now older than the TTL; the next landing expires it
    store.put("c", [])
    assert store.expired == 1
    assert store.take("b") is None
    assert store.take("c") == []


def test_store_take_after_ttl_without_further_puts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _ShiftedClock()
    monkeypatch.setattr(store_mod, "time", clock)
    store = ReceiveStore(ttl_s=10.0)
    store.put("orphan", [bytearray(b"x" * 100)])
    clock.offset = 11.0
    assert len(store) == 0
    assert store.take("orphan") is None
