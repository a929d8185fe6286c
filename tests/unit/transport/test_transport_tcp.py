"""TCP-only transport behaviour (deadlines, pooled connections, the receiver's drop acknowledgement,
shutdown) on real sockets at 127.0.0.1, plus addresses, the backend registry and process endpoints.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.transport_support import poll as _poll
from tests.transport_support import recv_within as _recv
from tests.transport_support import unique as _unique
from tetriserve.transport import endpoints
from tetriserve.transport.api import TransferState
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.registry import make_transport
from tetriserve.transport.tcp import TcpTransport, parse_address

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
        while thread.name == "kv-recv" and frame is not None:  # blocked reading a frame's header
            if frame.f_code.co_name == "_recv_exact":
                return True
            frame = frame.f_back
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


def test_a_frame_cut_short_marks_its_key_failed_at_once_and_late_data_clears_it(make: Callable[..., Any]) -> None:
    rx = make("tcp")
    header = json.dumps({"key": "kv-1", "sizes": [1 << 20]}).encode()
    with socket.create_connection(parse_address(rx.address), timeout=5.0) as sender:
        sender.sendall(struct.pack("!4sI", b"TSKV", len(header)) + header + b"x" * 1000)
    # the sender died mid-transfer: the receiver knows at once, not at the load's deadline
    assert "broke off" in _poll(lambda: rx.failed("kv-1")) and rx.recv("kv-1") is None
    rx.fail("kv-2", "the prefill worker says its send failed")
    assert rx.failed("kv-2") == "the prefill worker says its send failed"
    rx.discard("kv-2")
    assert rx.failed("kv-2") is None


@pytest.mark.parametrize("kind", ["tcp", "shm", "ucx", "nccl", "auto"])
def test_an_endpoint_bound_to_every_interface_advertises_an_address_peers_reach(
    make: Callable[..., Any], kind: str
) -> None:
    """A worker in a pod binds 0.0.0.0; its KV address must name this host, not the wildcard."""
    scheme = {"tcp": "", "shm": "", "ucx": "ucx://", "nccl": "nccl://", "auto": ""}[kind]
    rx = make(kind, listen=f"{scheme}0.0.0.0:0")
    assert "0.0.0.0" not in rx.address
    tx = make(kind)
    assert tx.send(rx.address, "k", [b"bytes"], 10.0).wait(10.0) is TransferState.DONE
    assert bytes(_recv(rx, "k")[0]) == b"bytes"
