"""Tests for the KV transfer transports: api, store, inproc, tcp, registry, endpoints.

Both two-sided backends are driven through the same contract (parametrized
``pair``); TCP-only behaviour (deadlines, pooled connections, the receiver's
drop acknowledgement) uses real sockets on 127.0.0.1. Nothing sleeps to wait
for state: ``_poll`` retries with a deadline.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

from transport import endpoints
from transport import store as store_mod
from transport.api import TransferState, Transport
from transport.inproc import InProcTransport
from transport.registry import make_transport
from transport.store import ReceiveStore
from transport.tcp import TcpTransport, parse_address

_T = TypeVar("_T")
_names = itertools.count()


def _poll(fn: Callable[[], _T | None], timeout: float = 10.0, what: str = "condition") -> _T:
    """Call ``fn`` until it returns something other than None/False, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.001)


def _recv(t: Transport, key: str, timeout: float = 10.0) -> list[bytearray]:
    return _poll(lambda: t.recv(key), timeout, f"key {key!r} to land on {t.address}")


def _unique(prefix: str = "t") -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns()}"


@pytest.fixture
def make() -> Iterator[Callable[..., Any]]:
    """Factory of transports of either backend; everything it made is closed at teardown."""
    opened: list[Transport] = []

    def _make(kind: str, **kwargs: Any) -> Any:
        t: Transport = TcpTransport(**kwargs) if kind == "tcp" else InProcTransport(_unique(), **kwargs)
        opened.append(t)
        return t

    yield _make
    for t in opened:
        t.close()


@pytest.fixture(params=["tcp", "inproc"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pair(make: Callable[..., Any], kind: str) -> tuple[Any, Any]:
    """(sender, receiver) of the parametrized backend."""
    return make(kind), make(kind)


@pytest.fixture
def dead_port() -> Iterator[str]:
    """An address nothing listens on: a bound, non-listening socket holds the port so no one else takes it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


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
    assert [type(b) for b in got] == [bytearray] * len(buffers)
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


def test_discard_before_arrival_drops_the_late_data(pair: tuple[Any, Any], kind: str) -> None:
    tx, rx = pair
    assert rx.discard("late") is False  # nothing there yet: remembered as discarded
    handle = tx.send(rx.address, "late", [b"x" * 1000], 5.0)
    state = handle.wait(5.0)
    assert rx.recv("late") is None
    assert rx.stats().transfers_received == 0
    assert rx.stats().bytes_received == 0
    if kind == "tcp":  # the receiver acknowledges the drop; the sender learns of it
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

    nowhere = dead_port if kind == "tcp" else "inproc://nobody-home"
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


# -- TCP specifics --------------------------------------------------------------------------------------


def test_send_to_dead_port_fails_within_deadline(make: Callable[..., Any], dead_port: str) -> None:
    tx = make("tcp")
    handle = tx.send(dead_port, "k", [b"x" * 10], deadline_s=2.0)
    assert handle.wait(5.0) is TransferState.FAILED
    assert handle.finished is not None and handle.finished - handle.started <= 2.5
    assert handle.error is not None and dead_port in handle.error and "k" in handle.error


def test_send_to_silent_peer_fails_at_deadline(make: Callable[..., Any]) -> None:
    """A peer that accepts but never acknowledges: the deadline bounds connect + write + ack together."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        dst = f"127.0.0.1:{silent.getsockname()[1]}"
        tx = make("tcp")
        handle = tx.send(dst, "k", [b"x" * 10], deadline_s=0.3)
        assert handle.wait(5.0) is TransferState.FAILED
        assert handle.finished is not None and handle.finished - handle.started < 0.3 + 1.0
        assert handle.error is not None and dst in handle.error
        assert tx.stats().transfers_failed == 1
    finally:
        silent.close()


def test_inproc_send_to_unknown_endpoint_fails(make: Callable[..., Any]) -> None:
    tx = make("inproc")
    handle = tx.send("inproc://nobody", "k", [b"x"], 1.0)
    assert handle.state is TransferState.FAILED
    assert handle.error is not None and "inproc://nobody" in handle.error


class _FakeReceiver:
    """Speaks the TCP transport's wire format; optionally closes each connection after one frame."""

    def __init__(self, close_after_frame: bool) -> None:
        self.close_after_frame = close_after_frame
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.frames: list[tuple[str, bytes]] = []
        self.accepted = 0
        self.closed = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    @staticmethod
    def _exact(conn: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = conn.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        with conn:
            while not self._stop.is_set():
                try:
                    magic, hlen = struct.unpack("!4sI", self._exact(conn, 8))
                    header = json.loads(self._exact(conn, hlen))
                    data = b"".join(self._exact(conn, int(n)) for n in header["sizes"])
                except (OSError, ConnectionError):
                    return
                assert magic == b"TSKV"
                self.frames.append((header["key"], data))
                conn.sendall(b"\x01")
                if self.close_after_frame:
                    break
        self.closed += 1

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):  # already closed by the serving thread
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(2.0)


def test_pooled_connection_is_reused(make: Callable[..., Any]) -> None:
    fake = _FakeReceiver(close_after_frame=False)
    try:
        tx = make("tcp")
        for i in range(3):
            assert tx.send(fake.address, f"k{i}", [b"abc" * i], 5.0).wait(5.0) is TransferState.DONE
        assert [k for k, _ in fake.frames] == ["k0", "k1", "k2"]
        assert fake.accepted == 1
    finally:
        fake.stop()


def test_stale_pooled_connection_is_retried_on_a_fresh_one(make: Callable[..., Any]) -> None:
    fake = _FakeReceiver(close_after_frame=True)
    try:
        tx = make("tcp")
        assert tx.send(fake.address, "k1", [b"one"], 5.0).wait(5.0) is TransferState.DONE
        _poll(lambda: fake.closed >= 1, 5.0, "the receiver to close the first connection")
        # the pooled socket is now stale: the send must notice and retry once on a new connection
        handle = tx.send(fake.address, "k2", [b"two", b"!"], 5.0)
        assert handle.wait(5.0) is TransferState.DONE, handle.error
        assert fake.frames == [("k1", b"one"), ("k2", b"two!")]
        assert fake.accepted == 2
        assert tx.stats().transfers_failed == 0 and tx.stats().transfers_sent == 2
    finally:
        fake.stop()


def test_receiver_survives_a_garbage_frame(make: Callable[..., Any]) -> None:
    tx, rx = make("tcp"), make("tcp")
    with socket.create_connection(parse_address(rx.address), timeout=5.0) as bad:
        bad.sendall(b"JUNK" + struct.pack("!I", 3) + b"abc")
        bad.settimeout(5.0)
        # the receiver hangs up on a bad frame (RST rather than FIN when bytes are left unread)
        with contextlib.suppress(ConnectionResetError):
            assert bad.recv(1) == b""
    assert tx.send(rx.address, "good", [b"fine"], 5.0).wait(5.0) is TransferState.DONE
    assert _recv(rx, "good") == [bytearray(b"fine")]
    assert rx.stats().transfers_received == 1


def test_send_to_malformed_address_fails(make: Callable[..., Any]) -> None:
    tx = make("tcp")
    handle = tx.send("not-an-address", "k", [b"x"], deadline_s=0.3)
    assert handle.wait(0.5) is TransferState.FAILED
    assert handle.error is not None and "not-an-address" in handle.error


def test_close_fails_queued_sends(make: Callable[..., Any]) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never acknowledges: occupies the one send thread
    try:
        dst = f"127.0.0.1:{silent.getsockname()[1]}"
        tx = TcpTransport(send_threads=1)
        try:
            tx.send(dst, "busy", [b"x"], deadline_s=0.5)
            queued = tx.send(dst, "queued", [b"y"], deadline_s=0.5)
        finally:
            tx.close()
        assert queued.wait(0.3) is TransferState.FAILED
    finally:
        silent.close()


def _receiver_thread_waits_for_a_frame() -> bool:
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.ident is not None else None
        if thread.name == "kv-recv" and frame is not None and frame.f_code.co_name == "_recv_exact":
            return True
    return False


def test_send_to_closed_receiver_over_pooled_connection_fails(make: Callable[..., Any]) -> None:
    tx = make("tcp")
    rx = TcpTransport()
    assert tx.send(rx.address, "warm", [b"x"], 5.0).wait(5.0) is TransferState.DONE  # pools a connection
    # Wait until the receiver's connection thread is back in _recv_exact for the next frame header (after
    # DONE every read of the first frame is over), so close() cannot race its loop's _closed check.
    _poll(_receiver_thread_waits_for_a_frame, 5.0, "the receiver thread to wait for the next frame")
    rx.close()
    assert tx.send(rx.address, "after-close", [b"y"], 2.0).wait(5.0) is TransferState.FAILED


# -- addresses, registry, endpoints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:5000", ("127.0.0.1", 5000)),
        ("tcp://10.0.0.2:7", ("10.0.0.2", 7)),
        ("localhost:0", ("localhost", 0)),
        (":8080", ("", 8080)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "nohost", "host:", "host:abc", "host:-1", "host:8o", "tcp://"])
def test_parse_address_rejects_bad_input(address: str) -> None:
    with pytest.raises(ValueError, match="host:port") as err:
        parse_address(address)
    assert repr(address) in str(err.value)


def test_parse_address_rejects_out_of_range_port() -> None:
    with pytest.raises(ValueError, match="port"):
        parse_address("127.0.0.1:70000")


def test_registry_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown backend 'rdma'") as err:
        make_transport("rdma", "127.0.0.1:0")
    assert "inproc" in str(err.value) and "tcp" in str(err.value)


def test_registry_builds_each_backend() -> None:
    tcp = make_transport("tcp", "127.0.0.1:0")
    name = _unique("reg")
    inproc = make_transport("inproc", name)
    try:
        assert isinstance(tcp, TcpTransport)
        host, port = parse_address(tcp.address)
        assert host == "127.0.0.1" and port > 0
        assert isinstance(inproc, InProcTransport) and inproc.address == f"inproc://{name}"
    finally:
        tcp.close()
        inproc.close()


def test_inproc_duplicate_address_rejected_until_closed() -> None:
    name = _unique("dup")
    first = InProcTransport(name)
    try:
        with pytest.raises(ValueError, match=f"inproc://{name}"):
            InProcTransport(name)
    finally:
        first.close()
    again = InProcTransport(name)  # the address is free once closed
    again.close()


def test_endpoints_get_or_create_and_close_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "_ENDPOINTS", {})
    name = _unique("ep")
    a = endpoints.get_or_create("worker", backend="inproc", listen=name)
    try:
        assert endpoints.get_or_create("worker", backend="inproc", listen="ignored") is a
        assert a.address == f"inproc://{name}"
        b = endpoints.get_or_create("connector", backend="tcp", listen="127.0.0.1:0")
        assert isinstance(b, TcpTransport) and b is not a
    finally:
        endpoints.close_all()
    assert endpoints._ENDPOINTS == {}
    InProcTransport(name).close()  # close_all released the in-process address
