"""One-sided pull over shared memory (issue #16): the reader takes published KV out of the publisher's own slabs.

The ``shm`` backend's push copies the KV into a slab at send time and lends it to
the receiver. A pull turns that around, as NIXL's READ does: the publisher
(a prefill worker) copies each part of a prompt's KV into a slab of its pool when
its packer parks it (``publish``), and the reader (the decode worker chosen for
the request) asks for the key once and maps those slabs itself, each part as it
is published, then lands views of them in its own store; no byte is copied
between the two processes, and the publisher sends nothing but where the bytes
are::

    reader (decode worker)                         publisher (prefill worker)
    pull(src, k) ─UNIX socket─ {pull: k, mapped} ─▶ for each part of k, as its packer publishes it:
                                                       take it from the store (the slab it lives in)
    map the slab (its fd rides along once),  ◀──────── {key: k#part<i>, slab, sizes, last} (+ fd)
    land views of it in the store
    ... the load copies them into the blocks;
    the last view dropped: ─────── release(slab) ────▶ the slab is free for the next publish

What the reader has mapped of a publisher's pooled slabs stays mapped across
pulls (keyed by the publisher's instance), so a part costs no new mapping and
no page faults after the first. A pull's handle is ``DONE`` once the last part
has landed; it is ``FAILED``, and the reader's store marks the key failed, when
the publisher says the key failed or was discarded, when the connection breaks
(the publisher died), or past the deadline. A reader that dies breaks the
connection: the publisher abandons the slabs it had lent (never reused; the
memory goes with the last mapping). Published KV nobody pulls or takes is
dropped with the lease (the store's TTL) and its slab freed.

Only between endpoints of one host (``lends_to``); a reader elsewhere gets the
KV pushed, as before (the prefill side sends the published views inline).
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import queue
import secrets
import socket
import struct
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tetriserve.transport import parts
from tetriserve.transport.api import Buffer, TransferHandle
from tetriserve.transport.tcp import _recv_exact, split_views

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tetriserve.transport.shm import ShmTransport, _Slab

    _Base = ShmTransport
else:
    _Base = object

logger = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
_RELEASE = struct.Struct("!I")  # reader -> publisher: a slab id it no longer maps views of
_WAIT_S = 0.05  # the publisher's longest wait for the store to change before it looks again


class Published(list):  # type: ignore[type-arg]
    """The views of one published key as its store entry holds them, with the slab they live in."""

    slab: _Slab


@dataclass(eq=False)
class _PullConn:
    """A reader's connection to one publisher, one pull at a time: the slabs of the last pull still lent."""

    src: str
    sock: socket.socket
    outstanding: set[int] = field(default_factory=set)
    done: bool = False  # the pull's data phase is over: once nothing is outstanding, the connection is idle
    broken: bool = False


class ShmPull(_Base):
    """Mixed into ``ShmTransport``: ``reserve``, ``publish``, ``lending``, ``lends_to`` and ``pull``, and the
    publisher's side of a pull."""

    def _init_pull(self, enabled: bool) -> None:
        self._pull_enabled = enabled
        self._instance = secrets.token_hex(8)  # tells a restarted publisher's slab ids from its predecessor's
        self._maps_lock = threading.Lock()
        self._pulled_maps: dict[str, tuple[str, dict[int, mmap.mmap]]] = {}  # src -> (its instance, slab maps)
        self._lendings: dict[str, tuple[TransferHandle, float]] = {}  # key -> (its ``lending`` handle, deadline)
        # reader: data phases on pooled threads and connections, slab releases on one thread of their own
        self._pull_executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="kv-shm-pull")
        self._pull_idle: dict[str, queue.SimpleQueue[_PullConn]] = {}
        self._pull_lock = threading.Lock()
        self._releases: queue.SimpleQueue[tuple[_PullConn, int] | None] = queue.SimpleQueue()
        threading.Thread(target=self._release_loop, name="kv-shm-release", daemon=True).start()

    def _close_pull(self) -> None:
        self._releases.put(None)
        self._pull_executor.shutdown(wait=False, cancel_futures=True)
        for idle in self._pull_idle.values():
            while True:
                try:
                    self._close_pull_sock(idle.get_nowait().sock)
                except queue.Empty:
                    break

    # -- publisher ---------------------------------------------------------------------------
    def publish(self, key: str, buffers: Sequence[Buffer], expires: bool = True) -> None:
        """Park ``buffers`` under ``key`` as ``hold`` does, in a slab a reader on this host can map (``pull``)."""
        if isinstance(buffers, Published):  # filled in place (``reserve``): nothing to copy
            self._store.put(key, buffers, landed=False, expires=expires)
            return
        views = [memoryview(b).cast("B") for b in buffers]
        if not self._pull_enabled or sum(v.nbytes for v in views) == 0:
            self.hold(key, buffers, expires)
            return
        self._store.put(key, self._into_slab(views), landed=False, expires=expires)

    def reserve(self, sizes: list[int]) -> list[Any]:
        """Writable buffers of ``sizes`` bytes in one slab, to fill and ``publish`` without a copy (``pack``
        gathers a prompt's KV blocks straight into them)."""
        if not self._pull_enabled or sum(sizes) == 0:
            return super().reserve(sizes)
        return self._slab_views(sizes)

    def _slab_views(self, sizes: list[int]) -> Published:
        """Views of a slab taken from the pool, one per size; the slab goes back once every view is gone (taken
        and dropped, discarded, expired, or released by the reader it was lent to)."""
        slab = self._take_slab(sum(sizes))
        base = np.frombuffer(slab.map, dtype=np.uint8, count=sum(sizes))
        held = Published(split_views(base, sizes))
        held.slab = slab
        weakref.finalize(base, self._give_back, slab)
        return held

    def _into_slab(self, views: Sequence[memoryview]) -> Published:
        held = self._slab_views([v.nbytes for v in views])
        for dst, v in zip(held, views, strict=True):
            dst[:] = v
        return held

    def lending(self, key: str, deadline_s: float) -> TransferHandle:
        """A handle on ``key``'s pull by a reader, as ``send`` gives on a push: ``DONE`` once its last part is
        handed over (``nbytes`` counts the parts), ``FAILED`` if the pull fails or none comes within ``deadline_s``."""
        handle = TransferHandle(key, 0)
        now = time.monotonic()
        with self._maps_lock:
            expired = [k for k, (_, deadline) in self._lendings.items() if deadline <= now]
            stale = [self._lendings.pop(k)[0] for k in expired]
            self._lendings[key] = (handle, now + deadline_s)
        for h in stale:
            h.complete(f"{h.key} was not pulled within its deadline")
        return handle

    def _lent(self, key: str, nbytes: int = 0, done: bool = False, error: str | None = None) -> None:
        with self._maps_lock:
            entry = self._lendings.get(key)
            if entry is None:
                return
            entry[0].nbytes += nbytes
            if done or error is not None:
                del self._lendings[key]
        if done or error is not None:
            entry[0].complete(error)

    def lends_to(self, dst: str) -> bool:
        """Whether the endpoint at ``dst`` can pull what this one publishes: an shm endpoint of this host."""
        from tetriserve.transport.shm import split_address

        return self._pull_enabled and dst.startswith("shm://") and split_address(dst)[0] == self._host_id

    def _serve_pull(self, conn: socket.socket, header: dict[str, Any]) -> bool:
        """A reader's pull of ``header["pull"]``: each part, as it is published, goes as where it lies; then the
        slabs lent are freed as the reader releases them (abandoned if it goes away first). True: the
        connection serves the reader's next pull."""
        key, deadline = str(header["pull"]), time.monotonic() + float(header["deadline_s"])
        mapped = set(header["mapped"]) if header.get("instance") == self._instance else set()
        lent: dict[int, Published] = {}
        index, last = 0, False
        try:
            while not last:
                version = self._store.version()
                found = self._next_part(key, index)
                if found is None:
                    why = self._store.failed(key) or self._store.dropped(key)
                    if why is None and time.monotonic() >= deadline:
                        why = f"{key} was not published within the pull's deadline"
                    if why is not None:
                        self._lent(key, error=why)
                        self._reply(conn, {"error": why})
                        break
                    if self._closed.is_set():
                        return False
                    self._store.wait_newer(version, min(_WAIT_S, max(deadline - time.monotonic(), 0.0)))
                    continue
                part, held, last = found
                started, slab, nbytes = time.monotonic(), held.slab, sum(v.nbytes for v in held)
                reply = {"key": part, "sizes": [v.nbytes for v in held], "slab": slab.id, "size": slab.size,
                         "pooled": slab.pooled, "last": last, "instance": self._instance}  # fmt: skip
                lent[slab.id] = held
                self._count_lent(nbytes)  # before the reader can see it
                self._reply(conn, reply, None if slab.id in mapped else slab.fd)
                mapped.add(slab.id)
                with self._stats_lock:
                    self._send_s += time.monotonic() - started
                self._lent(key, nbytes, done=last)
                index += 1
            while lent:
                (sid,) = _RELEASE.unpack(_recv_exact(conn, _RELEASE.size))
                lent.pop(sid, None)  # its views go: the slab is free again
            return True
        except (OSError, ConnectionError) as exc:
            self._lent(key, error=f"the pull of {key} broke off: {exc}")
            if lent:
                logger.info("shm pull of %s: reader went away holding %d slab(s): %s", key, len(lent), exc)
            self._abandon_lent(lent)
            return False

    def _next_part(self, key: str, index: int) -> tuple[str, Published, bool] | None:
        """Part ``index`` of ``key`` (or, at 0, the key published whole), in a slab, if it is here."""
        candidates = [parts.part_key(key, index, False), parts.part_key(key, index, True)]
        if index == 0:
            candidates.append(key)
        for part in candidates:
            held = self._store.take_exact(part)
            if held is None:
                continue
            if not isinstance(held, Published):  # held, not published: into a slab now
                held = self._into_slab([memoryview(b).cast("B") for b in held])
            return part, held, parts.is_last(part)
        return None

    @staticmethod
    def _reply(conn: socket.socket, header: dict[str, Any], fd: int | None = None) -> None:
        frame = json.dumps(header).encode()
        frame = _LEN.pack(len(frame)) + frame
        if fd is None:
            conn.sendall(frame)
        else:
            socket.send_fds(conn, [frame], [fd])

    def _count_lent(self, nbytes: int) -> None:
        """A part lent counts as sent (its seconds, added once it is handed over, are those of saying where it
        lies, not of moving its bytes)."""
        with self._stats_lock:
            self._sent += 1
            self._bytes_sent += nbytes

    def _abandon_lent(self, lent: dict[int, Published]) -> None:
        """The reader may still map these: never reuse them; this side lets go once its views are gone."""
        slabs = [held.slab for held in lent.values()]
        with self._slab_lock:
            for slab in slabs:
                self._slabs.pop(slab.id, None)  # so the views' finalizers do not give them back
        lent.clear()
        for slab in slabs:
            with contextlib.suppress(BufferError):
                slab.close()

    # -- reader ------------------------------------------------------------------------------
    def pull(self, src: str, key: str, deadline_s: float) -> TransferHandle | None:
        """Bring ``key`` (every part, as it is published) from the endpoint at ``src`` into this endpoint's
        store, reading the publisher's slabs in place; None where ``src`` does not lend to this endpoint."""
        from tetriserve.transport.shm import split_address

        if not (self._pull_enabled and src.startswith("shm://") and split_address(src)[0] == self._host_id):
            return None
        handle = TransferHandle(key, 0)
        if self._closed.is_set():
            handle.complete("transport closed")
            return handle
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
            request = {"pull": key, "deadline_s": max(deadline - time.monotonic(), 0.0), "instance": known[0],
                       "mapped": list(known[1])}  # fmt: skip
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        self._reply(conn.sock, request)
        try:
            while True:
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                header, fds = self._read_reply(conn.sock)
                if "error" in header:
                    return str(header["error"])
                known = self._pulled_map(conn.src, known, header, fds)
                slab = int(header["slab"])
                with self._pull_lock:
                    conn.outstanding.add(slab)
                self._land_pulled(str(header["key"]), known[1][slab], header, conn)
                if not header["pooled"]:
                    del known[1][slab]  # a one-off: mapped for this part only
                handle.nbytes += sum(int(n) for n in header["sizes"])
                if header["last"]:
                    return None
        finally:
            with self._pull_lock:
                conn.done = True
                idle = not conn.outstanding and not conn.broken
            if idle:
                self._checkin_pull(conn)

    def _checkout_pull(self, src: str, deadline: float, fresh: bool) -> _PullConn:
        from tetriserve.transport.shm import _unix_name, split_address
        from tetriserve.transport.tcp import parse_address

        if not fresh:
            with contextlib.suppress(queue.Empty, KeyError):
                conn = self._pull_idle[src].get_nowait()
                conn.done = False
                return conn
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._conns_lock:
            self._conns.add(sock)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(_unix_name(self._host_id, parse_address(split_address(src)[1])[1]))
        except OSError:
            self._close_pull_sock(sock)
            raise
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
                conn.sock.sendall(_RELEASE.pack(slab))
            except OSError:
                self._break_pull(conn)
                continue
            if idle:
                self._checkin_pull(conn)

    @staticmethod
    def _read_reply(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
        head, fds, _, _ = socket.recv_fds(sock, _LEN.size, 1)
        if not head:
            raise ConnectionError("publisher closed the connection")
        head = bytes(head) + bytes(_recv_exact(sock, _LEN.size - len(head)))
        return json.loads(_recv_exact(sock, _LEN.unpack(head)[0])), fds

    def _pulled_map(
        self, src: str, known: tuple[str, dict[int, mmap.mmap]], header: dict[str, Any], fds: list[int]
    ) -> tuple[str, dict[int, mmap.mmap]]:
        """``known`` (the publisher's instance, the reader's maps of its slabs) with the slab ``header`` names
        mapped: kept from an earlier pull, or a new mapping of the descriptor that came along. Pooled slabs stay
        mapped for later pulls (they will carry other parts)."""
        instance = str(header["instance"])
        if known[0] != instance:  # the first reply, or the publisher restarted: its slab ids start over
            known = (instance, {})
        if fds:
            try:
                mapping = mmap.mmap(fds[0], int(header["size"]))
            finally:
                for fd in fds:
                    os.close(fd)
            known[1][int(header["slab"])] = mapping
        if header["pooled"]:
            with self._maps_lock:
                self._pulled_maps[src] = known
        return known

    def _land_pulled(self, key: str, mapping: mmap.mmap, header: dict[str, Any], conn: _PullConn) -> None:
        sizes = [int(n) for n in header["sizes"]]
        base = np.frombuffer(mapping, dtype=np.uint8, count=sum(sizes))
        views = split_views(base, sizes)
        weakref.finalize(base, self._releases.put, (conn, int(header["slab"])))  # even if the store drops it
        del base
        self._store.put(key, views)
