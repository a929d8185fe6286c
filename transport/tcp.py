"""TCP backend: KV bytes bounce through host memory over sockets (TetriInfer §4, the *Indirect* link).

Wire format, one frame per transfer, many frames per pooled connection::

    b"TSKV" | u32 header_len | header (JSON: key, sizes) | buffer_0 | ... | buffer_n
    receiver replies one byte: 0x01 stored, 0x00 dropped (key was discarded)

A frame cut short (the sender died, the connection broke) marks its key failed
in the receiver's store at once, so the engine waiting for it fails the load now.

A listener thread accepts connections, one thread per connection reads
frames into the ``ReceiveStore``. Sends run on a small thread pool; the caller
polls the returned ``TransferHandle``. Each send has a deadline that bounds
connect, write and acknowledgement together.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from tetriserve.transport.api import Buffer, Received, TransferHandle, advertised_host
from tetriserve.transport.store import StoreBackedEndpoint

logger = logging.getLogger(__name__)

_MAGIC = b"TSKV"
_HDR = struct.Struct("!4sI")
_MAX_HEADER = 1 << 20


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k


def split_views(base: npt.NDArray[np.uint8], sizes: list[int]) -> list[Received]:
    """Writable views of ``base`` one after another, ``sizes`` bytes each; while any lives, ``base`` does (a
    ``weakref.finalize`` on it runs once the last view of the transfer is gone)."""
    views: list[Received] = []
    offset = 0
    for n in sizes:
        views.append(base[offset : offset + n].data)  # a memoryview of the slice, which keeps ``base``
        offset += n
    return views


def _sees_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


_Landing = bytearray | npt.NDArray[np.uint8]  # a pooled buffer: plain, or a page-locked tensor's array


class ReceivePool:
    """Landing buffers reused once every view of the transfer they held is dropped: a transfer lands in pages
    that are already there instead of a fresh allocation the kernel must fault in (at 64 MiB and more that
    costs more than the copy). Up to ``pool_bytes`` are kept; a small transfer gets plain bytearrays.

    ``pinned`` (default: when this process sees a CUDA GPU) makes the pooled buffers page-locked, so unpacking
    them into a GPU KV cache copies by DMA: 6.5 ms instead of 28.4 for 256 MiB on an H100 (``python
    benchmarks/gpu_transport.py --sizes-mib 1 4 16 64 256 --repeats 10``, ``benchmarks/results/gpu_transport.md``)."""

    MIN_POOLED = 1 << 20

    def __init__(self, pool_bytes: int = 1 << 30, pinned: bool | None = None) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[_Landing]] = {}
        self._pool_bytes = pool_bytes
        self._held = 0  # bytes of pooled buffers, free or in use
        self.pinned = _sees_cuda() if pinned is None else pinned

    def _allocate(self, size: int) -> _Landing:
        if not self.pinned:
            return bytearray(size)
        import torch

        return torch.empty(size, dtype=torch.uint8, pin_memory=True).numpy()  # the array keeps the tensor alive

    def views(self, sizes: list[int]) -> list[Received]:
        """Writable buffers of ``sizes`` bytes, to receive one transfer into."""
        total = sum(sizes)
        if total < self.MIN_POOLED:
            return [bytearray(n) for n in sizes]
        size = 1 << (total - 1).bit_length()
        with self._lock:
            free = self._free.get(size)
            buf = free.pop() if free else None
            pooled = buf is not None or self._held + size <= self._pool_bytes
            if buf is None and pooled:
                self._held += size
        if buf is None:
            buf = self._allocate(size) if pooled else bytearray(size)
        base = np.frombuffer(buf, dtype=np.uint8, count=total)
        if pooled:
            weakref.finalize(base, self._give_back, size, buf)
        return split_views(base, sizes)

    def _give_back(self, size: int, buf: _Landing) -> None:
        with self._lock:
            self._free.setdefault(size, []).append(buf)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"transport address must be host:port, got {address!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"transport address {address!r}: port {port} is outside 0..65535")
    return host, int(port)


class TcpTransport(StoreBackedEndpoint):
    def __init__(self, listen: str = "127.0.0.1:0", ttl_s: float = 300.0, send_threads: int = 4) -> None:
        super().__init__(ttl_s)
        self._server = socket.create_server(parse_address(listen), reuse_port=False)
        host, port = self._server.getsockname()[:2]
        self._address = f"{advertised_host(host)}:{port}"
        self._closed = threading.Event()
        self._pending: set[TransferHandle] = set()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._pool: dict[str, queue.SimpleQueue[socket.socket]] = {}
        self._pool_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=send_threads, thread_name_prefix="kv-send")
        self._landing = ReceivePool()
        args = (self._server, self._serve_frames, "kv-recv")
        threading.Thread(target=self._accept_loop, args=args, name=f"kv-listen-{port}", daemon=True).start()
        logger.info("tcp transport listening on %s", self._address)

    @property
    def address(self) -> str:
        return self._address

    # -- sending ---------------------------------------------------------------
    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        views = [memoryview(b).cast("B") for b in buffers]
        handle = TransferHandle(key, sum(v.nbytes for v in views))
        deadline = time.monotonic() + deadline_s
        if self._closed.is_set():
            handle.complete("transport closed")
            return handle
        with self._stats_lock:
            self._pending.add(handle)
        self._executor.submit(self._send_now, dst, key, views, deadline, handle)
        return handle

    def _send_now(self, dst: str, key: str, views: list[memoryview], deadline: float, handle: TransferHandle) -> None:
        try:
            self._send_attempts(dst, key, views, deadline, handle)
        except Exception as exc:  # bad destination, or a bug: the handle must still complete
            self._finish(handle, f"send {key} to {dst} failed: {exc}")
        finally:
            with self._stats_lock:
                self._pending.discard(handle)

    def _send_attempts(
        self, dst: str, key: str, views: list[memoryview], deadline: float, handle: TransferHandle
    ) -> None:
        header = json.dumps({"key": key, "sizes": [v.nbytes for v in views]}).encode()
        for attempt in (0, 1):  # a pooled connection may have gone stale: retry once on a fresh one
            sock = None
            try:
                sock = self._checkout(dst, deadline, fresh=attempt > 0)
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(_HDR.pack(_MAGIC, len(header)) + header)
                for v in views:
                    sock.sendall(v)
                ack = _recv_exact(sock, 1)
                self._checkin(dst, sock)
                self._finish(handle, None if ack == b"\x01" else f"receiver dropped {key} (discarded)")
                return
            except (OSError, ConnectionError) as exc:
                if sock is not None:
                    sock.close()
                if attempt == 1 or time.monotonic() >= deadline:
                    self._finish(handle, f"send {key} to {dst} failed: {exc}")
                    return

    def _connect_to(self, dst: str) -> tuple[str, int]:
        """Where ``dst`` listens for TCP (the shm backend's addresses carry a host id before it)."""
        return parse_address(dst)

    def _checkout(self, dst: str, deadline: float, fresh: bool) -> socket.socket:
        if not fresh:
            with self._pool_lock:
                idle = self._pool.get(dst)
            if idle is not None:
                try:
                    return idle.get_nowait()
                except queue.Empty:
                    pass
        sock = socket.create_connection(self._connect_to(dst), timeout=max(deadline - time.monotonic(), 0.001))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _checkin(self, dst: str, sock: socket.socket) -> None:
        with self._pool_lock:
            self._pool.setdefault(dst, queue.SimpleQueue()).put(sock)

    # -- receiving -------------------------------------------------------------
    def _accept_loop(self, server: socket.socket, serve: Callable[[socket.socket], None], name: str) -> None:
        """Accept on ``server`` until closed; each connection is served by ``serve`` on a thread of its own."""
        while not self._closed.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with self._conns_lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve_conn, args=(conn, serve), name=name, daemon=True).start()

    def _serve_conn(self, conn: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        try:
            serve(conn)
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            conn.close()

    def _serve_frames(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while not self._closed.is_set():
            try:
                magic, hlen = _HDR.unpack(_recv_exact(conn, _HDR.size))
            except (OSError, ConnectionError):
                return
            if magic != _MAGIC or hlen > _MAX_HEADER:
                logger.warning("tcp transport: bad frame from peer, closing connection")
                return
            key = None
            try:
                header = json.loads(_recv_exact(conn, hlen))
                key = str(header["key"])
                buffers = self._landing.views([int(n) for n in header["sizes"]])
                for buf in buffers:
                    _recv_into(conn, memoryview(buf))
                if self._closed.is_set():
                    return
                stored = self._store.put(key, buffers)
                conn.sendall(b"\x01" if stored else b"\x00")
            except (OSError, ConnectionError, ValueError, KeyError) as exc:
                logger.warning("tcp transport: receive of %s failed: %s", key, exc)
                if key is not None and not self._store.has(key):
                    self._store.fail(key, f"transfer of {key} broke off: {exc}")
                return

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._conns_lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._conns.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._stats_lock:
            pending = list(self._pending)
        for handle in pending:
            self._finish(handle, "transport closed")
        with self._pool_lock:
            for idle in self._pool.values():
                while True:
                    try:
                        idle.get_nowait().close()
                    except queue.Empty:
                        break
            self._pool.clear()
