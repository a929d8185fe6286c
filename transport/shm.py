"""Shared-memory backend: KV bytes cross between processes of one host through registered memory.

Each sender keeps a pool of slabs, anonymous shared-memory segments (``memfd``)
mapped once and reused, so the only per-transfer cost is one copy into pages
that are already there::

    sender                                                    receiver
    take a free slab that fits, copy the buffers in
    frame {key, sizes, slab} ─UNIX socket─▶ (the slab's fd rides along the first time on a connection)
                                                              map the slab once per connection, store views of
                                                              it: no copy
                             ◀── ack: stored?
                                                              the last view of the transfer dropped: the
                                                              receiver sets the slab's control byte (shared)
    the next take sees the byte: the slab is free again, and taken before slabs that came back earlier (its
    pages are still in the cache: one thread copies 16 MiB into one reused buffer at 15.9 GB/s, into two used
    in turn at 11.9, ``python benchmarks/diagnostics/copy_reuse.py``)

Slabs have no name anywhere: memory goes when the last process that maps it
lets go, so a dead peer strands nothing (a sender whose connection breaks
abandons the slabs lent over it; the receiver's views keep them alive as long
as it needs them). A transfer larger than what is free in the pool
(``pool_bytes``) gets a slab of its own, dropped after it. A peer on another
host, or one the UNIX socket cannot reach, gets the bytes inline over TCP as the
``tcp`` backend sends them, so ``shm`` also serves a cluster that spans hosts.

Addresses look like ``shm://<host id>@host:port``: the host id tells processes
that share memory (same boot, same IPC namespace) from the rest; the UNIX
socket is the abstract name derived from it and the port. Linux only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import queue
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tetriserve.transport.api import TransferHandle
from tetriserve.transport.shm_pull import Header, Landed, ShmPublisher, map_slab, recv_frame, send_frame
from tetriserve.transport.shm_pull_reader import ShmReader
from tetriserve.transport.tcp import TcpTransport, _recv_exact, parse_address, split_views

logger = logging.getLogger(__name__)

MIN_SLAB = 1 << 20
CONTROL = 64  # bytes after a slab's payload: byte 0 is the receiver's release mark
_ACK = struct.Struct("!B")  # stored?
_CLOSING = threading.Lock()  # a slab's fd is closed once, whoever lets it go last


def host_id() -> str:
    """Processes with the same id can share memory: same boot of the same kernel, same IPC namespace."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ipc = os.stat("/proc/self/ns/ipc").st_ino
    return hashlib.sha1(f"{boot}:{ipc}".encode()).hexdigest()[:12]


def split_address(address: str) -> tuple[str | None, str]:
    """(host id or None, host:port) of a ``shm://id@host:port`` or plain ``host:port`` address (what follows a
    ``?``, such as the UCX port of an ``auto`` endpoint, is not the shm part's)."""
    rest = address.removeprefix("shm://").partition("?")[0]
    hid, sep, hostport = rest.rpartition("@")
    return (hid if sep else None), hostport


def _unix_name(hid: str, port: int) -> str:
    return f"\0tetriserve-kv-{hid}-{port}"


class _Slab:
    def __init__(self, slab_id: int, size: int, pooled: bool) -> None:
        self.id, self.size, self.pooled = slab_id, size, pooled
        self.lent: _Conn | None = None  # the connection whose receiver holds views of it (pushes)
        self.fd = os.memfd_create(f"tetriserve-kv-{slab_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size + CONTROL)
            self.map = mmap.mmap(self.fd, size + CONTROL)
        except BaseException:
            os.close(self.fd)
            raise

    def lend(self) -> None:
        """About to be pushed: not released until the receiver says so."""
        self.map[self.size] = 0

    def released(self) -> bool:
        return self.map[self.size] == 1

    def close(self) -> None:
        """Idempotent: a slab may be let go by its last view's finalizer and by an abandon or a shutdown."""
        with _CLOSING:
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        os.close(fd)  # the mapping stays until closed here and wherever else it is mapped
        with contextlib.suppress(BufferError):  # views of it still alive: unmapped once the last goes
            self.map.close()


@dataclass
class _Conn:
    """A same-host connection from this sender: which of its slabs the receiver has mapped."""

    sock: socket.socket
    mapped: set[int] = field(default_factory=set)


def _mark_released(mapping: mmap.mmap, size: int) -> None:
    """The receiver's last view of a pushed slab is gone: mark it in the slab's control byte for its sender."""
    with contextlib.suppress(ValueError):  # unmapped here already: the sender's connection is gone
        mapping[size] = 1


class ShmTransport(ShmPublisher, ShmReader, TcpTransport):
    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        ttl_s: float = 300.0,
        send_threads: int = 4,
        pool_bytes: int = 1 << 30,
        host: str | None = None,
        pull: bool = True,
    ) -> None:
        """``host``: this endpoint's host id, ``host_id()`` by default (tests play two hosts on one); ``pull``:
        publish into slabs and pull from peers of this host (``shm_pull.py``), else push only."""
        super().__init__(listen, ttl_s, send_threads)
        self._init_publisher(pull)
        self._init_reader()
        self._host_id = host or host_id()
        self._pool_bytes = pool_bytes
        self._slab_lock = threading.Lock()
        self._slabs: dict[int, _Slab] = {}  # pooled slabs, free or lent
        self._free: list[_Slab] = []
        self._next_slab = 0
        self._shared: dict[str, queue.SimpleQueue[_Conn]] = {}
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unix.bind(_unix_name(self._host_id, parse_address(super().address)[1]))
        self._unix.listen()
        args = (self._unix, self._serve_shared, "kv-shm-recv")
        threading.Thread(target=self._accept_loop, args=args, name="kv-shm-listen", daemon=True).start()

    @property
    def address(self) -> str:
        return f"shm://{self._host_id}@{super().address}"

    def _connect_to(self, dst: str) -> tuple[str, int]:
        return parse_address(split_address(dst)[1])

    # -- sending ---------------------------------------------------------------------
    def _send_attempts(
        self, dst: str, key: str, views: list[memoryview], deadline: float, handle: TransferHandle
    ) -> None:
        total = sum(v.nbytes for v in views)
        conn = None
        if split_address(dst)[0] == self._host_id and total > 0:
            with contextlib.suppress(OSError):
                conn = self._checkout_shared(dst, deadline)
        if conn is None:  # another host, nothing to map, or no shared path: the bytes go inline over TCP
            super()._send_attempts(dst, key, views, deadline, handle)
            return
        slab = self._take_slab(total)
        slab.lend()
        try:
            offset = 0
            for v in views:
                slab.map[offset : offset + v.nbytes] = v
                offset += v.nbytes
            header: Header = {"key": key, "sizes": [v.nbytes for v in views], "slab": slab.id, "size": slab.size,
                              "pooled": slab.pooled}  # fmt: skip
            conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            # the receiver maps a slab once per connection (a one-off slab, every time: its id is new)
            send_frame(conn.sock, header, None if slab.id in conn.mapped else slab.fd)
            conn.mapped.add(slab.id)
            (stored,) = _ACK.unpack(_recv_exact(conn.sock, _ACK.size))
        except (OSError, ConnectionError) as exc:
            conn.sock.close()
            self._abandon([*self._lent_over(conn), slab.id] if slab.pooled else [], slab)  # the receiver may hold them
            self._finish(handle, f"send {key} to {dst} failed: {exc}")
            return
        if stored and slab.pooled:
            with self._slab_lock:
                slab.lent = conn  # free again once the receiver marks it released (``_take_slab``)
        else:
            self._give_back(slab)  # dropped by the receiver (no view of it there), or a one-off now mapped there
        self._shared.setdefault(dst, queue.SimpleQueue()).put(conn)
        self._finish(handle, None if stored else f"receiver dropped {key} (discarded)")

    def _checkout_shared(self, dst: str, deadline: float) -> _Conn:
        with contextlib.suppress(queue.Empty, KeyError):
            return self._shared[dst].get_nowait()
        return _Conn(self._connect_unix(dst, deadline))

    def _connect_unix(self, dst: str, deadline: float) -> socket.socket:
        """A new connection to the UNIX socket of ``dst``, an shm endpoint of this host (pushes and pulls)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.connect(_unix_name(self._host_id, parse_address(split_address(dst)[1])[1]))
        except OSError:
            sock.close()
            raise
        return sock

    def _take_slab(self, nbytes: int) -> _Slab:
        """The smallest free pooled slab that fits, a new pooled one while the pool has room, else a one-off."""
        size = max(MIN_SLAB, 1 << (nbytes - 1).bit_length())
        with self._slab_lock:
            for slab in self._slabs.values():  # pushed slabs whose receiver has let go since
                if slab.lent is not None and slab.released():
                    slab.lent = None
                    self._free.append(slab)
            fits = [s for s in reversed(self._free) if s.size >= nbytes]
            if fits:
                slab = min(fits, key=lambda s: s.size)  # of the smallest, the one back last
                self._free.remove(slab)
                return slab
            full = sum(s.size for s in self._slabs.values()) + size > self._pool_bytes
        if full:
            self._reap_gone_receivers()  # slabs lent to a receiver that died will never come back: reclaim them
        with self._slab_lock:
            self._next_slab += 1
            pooled = sum(s.size for s in self._slabs.values()) + size <= self._pool_bytes
            slab = _Slab(self._next_slab, size, pooled)
            if pooled:
                self._slabs[slab.id] = slab
            return slab

    def _reap_gone_receivers(self) -> None:
        """Close idle connections whose receiver has hung up, abandoning the slabs lent over them."""
        for dst, pool in list(self._shared.items()):
            alive: list[_Conn] = []
            while True:
                try:
                    conn = pool.get_nowait()
                except queue.Empty:
                    break
                try:
                    gone = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    conn.sock.close()
                    self._abandon(self._lent_over(conn))
                else:
                    alive.append(conn)
            for conn in alive:
                pool.put(conn)
            if not alive:
                self._shared.pop(dst, None)

    def _lent_over(self, conn: _Conn) -> list[int]:
        with self._slab_lock:
            return [s.id for s in self._slabs.values() if s.lent is conn]

    def _give_back(self, slab: _Slab) -> None:
        if not slab.pooled:
            slab.close()
            return
        with self._slab_lock:
            if slab.id in self._slabs and slab not in self._free:
                self._free.append(slab)

    def _abandon(self, slab_ids: Sequence[int], current: _Slab | None = None) -> None:
        """Forget slabs a broken connection's receiver may still hold: never reused, this side unmapped (the
        memory goes once the receiver, if it lives, drops its views)."""
        with self._slab_lock:
            for sid in slab_ids:
                slab = self._slabs.pop(sid, None)
                if slab is not None:
                    with contextlib.suppress(ValueError):
                        self._free.remove(slab)
                    slab.close()
        if current is not None and not current.pooled:
            current.close()

    # -- receiving -------------------------------------------------------------------
    def _serve_shared(self, conn: socket.socket) -> None:
        maps: dict[int, mmap.mmap] = {}  # this sender's pooled slabs, mapped once
        while not self._closed.is_set():
            try:
                header, fds = recv_frame(conn)
            except (OSError, ConnectionError, ValueError):
                return
            if "pull" in header:  # a reader's pull (its connection carries its pulls, one after another)
                for fd in fds:
                    os.close(fd)
                if not self._serve_pull(conn, header):
                    return
                continue
            key = str(header["key"])
            try:
                slab, size = int(header["slab"]), int(header["size"])
                mapping = map_slab(fds, size + CONTROL) if fds else maps[slab]
                if fds and header["pooled"]:
                    maps[slab] = mapping  # mapped once per connection
                release = _mark_released if header["pooled"] else None  # a one-off the sender drops on the ack
                stored, token = self._land_views(key, mapping, [int(n) for n in header["sizes"]], release,
                                                 (mapping, size))  # fmt: skip
                if not stored and token is not None:
                    token.detach()  # the sender frees it on this ack; no release must follow
                conn.sendall(_ACK.pack(int(stored)))
            except (OSError, ConnectionError, ValueError, KeyError) as exc:
                logger.warning("shm transport: receive of %s failed: %s", key, exc)
                if not self._store.has(key):
                    self._store.fail(key, f"transfer of {key} broke off: {exc}")
                return

    def _land_views(
        self,
        key: str,
        mapping: mmap.mmap,
        sizes: list[int],
        release: Callable[..., None] | None,
        args: tuple[object, ...],
    ) -> Landed:
        """Store views of ``mapping`` (``sizes`` bytes each, one after another) under ``key``, pushed or pulled:
        whether the store took them, and the finalizer that calls ``release(*args)`` once the last is dropped."""
        base = np.frombuffer(mapping, dtype=np.uint8, count=sum(sizes))
        views = split_views(base, sizes)
        token = weakref.finalize(base, release, *args) if release is not None else None
        del base
        return self._store.put(key, views), token

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._unix.shutdown(socket.SHUT_RDWR)
        self._unix.close()
        super().close()
        self._close_reader()
        for pool in self._shared.values():
            while True:
                try:
                    pool.get_nowait().sock.close()
                except queue.Empty:
                    break
        with self._slab_lock:
            slabs, self._slabs, self._free = list(self._slabs.values()), {}, []
        for slab in slabs:
            with contextlib.suppress(BufferError):
                slab.close()
