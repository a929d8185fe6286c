"""The reader's side of shm's one-sided pull: a decode worker maps a prefill worker's published slabs.

See ``shm_pull.py`` for the protocol. A pull's data phase (ask for the key, map and
land each part as the publisher hands it over) runs on a pooled thread over a
pooled connection to that publisher (one pull at a time on a connection; a
stale one is replaced once). Slab releases go out on one thread of the
endpoint's own: the finalizer of a pulled part's last view queues it, and a
connection whose pull is over and has nothing left lent goes back to the pool.
"""

from __future__ import annotations

import contextlib
import mmap
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tetriserve.transport.api import TransferHandle
from tetriserve.transport.shm_pull import RELEASE, Header, Landed, map_slab, recv_frame, send_frame
from tetriserve.transport.tcp import TcpTransport


@dataclass(eq=False)
class _PullConn:
    """A reader's connection to one publisher, one pull at a time: the slabs of the last pull still lent."""

    src: str
    sock: socket.socket
    outstanding: set[int] = field(default_factory=set)
    done: bool = False  # the pull's data phase is over: once nothing is outstanding, the connection is idle
    broken: bool = False


class ShmReader(TcpTransport):
    """Mixed into ``ShmTransport``: ``pull`` (built on ``TcpTransport``, as ``ShmPublisher`` is)."""

    # ``ShmTransport``'s own, which this side uses
    _land_views: Callable[[str, mmap.mmap, list[int], Callable[..., None] | None, tuple[object, ...]], Landed]
    _connect_unix: Callable[[str, float], socket.socket]

    def _init_reader(self) -> None:
        self._maps_lock = threading.Lock()
        self._pulled_maps: dict[str, tuple[str, dict[int, mmap.mmap]]] = {}  # src -> (its instance, slab maps)
        self._pull_executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="kv-shm-pull")
        self._pull_idle: dict[str, queue.SimpleQueue[_PullConn]] = {}
        self._pull_lock = threading.Lock()
        self._releases: queue.SimpleQueue[tuple[_PullConn, int] | None] = queue.SimpleQueue()
        threading.Thread(target=self._release_loop, name="kv-shm-release", daemon=True).start()

    def _close_reader(self) -> None:
        self._releases.put(None)
        self._pull_executor.shutdown(wait=False, cancel_futures=True)
        for idle in self._pull_idle.values():
            while True:
                try:
                    self._close_pull_sock(idle.get_nowait().sock)
                except queue.Empty:
                    break

    def pull(self, src: str, key: str, deadline_s: float) -> TransferHandle | None:
        """Bring ``key`` (every part, as it is published) from the endpoint at ``src`` into this endpoint's
        store, reading the publisher's slabs in place; None where ``src`` does not lend to this endpoint."""
        if not self.lends_to(src):  # the same test either way: an shm endpoint of this host, pulls on
            return None
        if self._closed.is_set():
            return TransferHandle.refused(key, "transport closed")
        handle = TransferHandle(key, 0)
        self._pull_executor.submit(self._pull_now, src, key, time.monotonic() + deadline_s, handle)
        return handle

    def _pull_now(self, src: str, key: str, deadline: float, handle: TransferHandle) -> None:
        """A pull's data phase, on a pooled connection (a fresh one if the pooled one had gone stale)."""
        error = None
        for attempt in (0, 1):
            conn = None
            try:
                conn = self._checkout_pull(src, deadline, fresh=attempt > 0)
                error = self._pull_on(conn, key, deadline, handle)
                break
            except (OSError, ConnectionError, ValueError, KeyError) as exc:
                if conn is not None:
                    self._break_pull(conn)
                error = f"{type(exc).__name__}: {exc}"
                if attempt or handle.nbytes or time.monotonic() >= deadline:  # a fresh start only from nothing
                    break
        if error is None:
            with self._stats_lock:
                self._pulled += 1
            handle.complete()
            return
        why = f"pull of {key} from {src} failed: {error}"
        if not self._store.has(key):
            self._store.fail(key, why)
        with self._stats_lock:
            self._failed += 1
        handle.complete(why)

    def _pull_on(self, conn: _PullConn, key: str, deadline: float, handle: TransferHandle) -> str | None:
        """Ask for ``key`` and land each part as the publisher hands it over; the publisher's refusal (the key
        failed, was discarded, not published in time), or None once the last part is in. Raises on a broken
        connection."""
        with self._maps_lock:
            known = self._pulled_maps.get(conn.src, ("", {}))
            request: Header = {"pull": key, "deadline_s": max(deadline - time.monotonic(), 0.0), "instance": known[0],
                                "mapped": list(known[1])}  # fmt: skip
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        send_frame(conn.sock, request)
        try:
            while True:
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                header, fds = recv_frame(conn.sock)
                if "error" in header:
                    return str(header["error"])
                known = self._pulled_map(conn.src, known, header, fds)
                slab = int(header["slab"])
                with self._pull_lock:
                    conn.outstanding.add(slab)
                sizes = [int(n) for n in header["sizes"]]  # released even if the store drops them
                self._land_views(str(header["key"]), known[1][slab], sizes, self._releases.put, ((conn, slab),))
                if not header["pooled"]:
                    del known[1][slab]  # a one-off: mapped for this part only
                handle.nbytes += sum(sizes)
                if header["last"]:
                    return None
        finally:
            with self._pull_lock:
                conn.done = True
                idle = not conn.outstanding and not conn.broken
            if idle:
                self._checkin_pull(conn)

    def _checkout_pull(self, src: str, deadline: float, fresh: bool) -> _PullConn:
        if not fresh:
            with contextlib.suppress(queue.Empty, KeyError):
                conn = self._pull_idle[src].get_nowait()
                conn.done = False
                return conn
        sock = self._connect_unix(src, deadline)
        with self._conns_lock:
            self._conns.add(sock)  # shut down with the endpoint
        return _PullConn(src, sock)

    def _checkin_pull(self, conn: _PullConn) -> None:
        """A connection whose pull is over and whose slabs are all released: ready for the next pull."""
        if self._closed.is_set():
            self._close_pull_sock(conn.sock)
            return
        self._pull_idle.setdefault(conn.src, queue.SimpleQueue()).put(conn)

    def _break_pull(self, conn: _PullConn) -> None:
        """A connection that broke: its slabs are the publisher's to abandon, its maps may be stale."""
        with self._pull_lock:
            conn.broken = True
        self._close_pull_sock(conn.sock)
        with self._maps_lock:
            self._pulled_maps.pop(conn.src, None)  # slabs it abandons stay mapped only by what still holds them

    def _close_pull_sock(self, sock: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(sock)
        sock.close()

    def _release_loop(self) -> None:
        """Tell publishers of the slabs whose last pulled view is gone (one thread for every pull of this
        endpoint); a connection whose pull is over and has nothing left lent goes back to the pool."""
        while (item := self._releases.get()) is not None:
            conn, slab = item
            with self._pull_lock:
                if conn.broken:
                    continue
                conn.outstanding.discard(slab)
                idle = conn.done and not conn.outstanding
            try:
                conn.sock.sendall(RELEASE.pack(slab))
            except OSError:
                self._break_pull(conn)
                continue
            if idle:
                self._checkin_pull(conn)

    def _pulled_map(
        self, src: str, known: tuple[str, dict[int, mmap.mmap]], header: Header, fds: list[int]
    ) -> tuple[str, dict[int, mmap.mmap]]:
        """``known`` (the publisher's instance, the reader's maps of its slabs) with the slab ``header`` names
        mapped: kept from an earlier pull, or a new mapping of the descriptor that came along. Pooled slabs stay
        mapped for later pulls (they will carry other parts)."""
        instance = str(header["instance"])
        if known[0] != instance:  # the first reply, or the publisher restarted: its slab ids start over
            known = (instance, {})
        if fds:
            known[1][int(header["slab"])] = map_slab(fds, int(header["size"]))
        if header["pooled"]:
            with self._maps_lock:
                self._pulled_maps[src] = known
        return known
