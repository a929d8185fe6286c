"""One-sided pull over shared memory: the reader takes published KV out of the publisher's own slabs.

The ``shm`` backend's push copies the KV into a slab at send time and lends it to
the receiver. A pull turns that around, as NIXL's READ does: the publisher's
(a prefill worker's) packer gathers each part of a prompt's KV straight into a
slab of its pool (``reserve``, then ``publish``: registered memory, no pack copy),
and the reader (the decode worker chosen for the request) asks for the key once
and maps those slabs itself, each part as it is published, then lands views of
them in its own store; no byte is copied between the two processes, and the
publisher sends nothing but where the bytes are (the reader's side:
``shm_pull_reader.py``)::

    reader (decode worker)                         publisher (prefill worker)
    pull(src, k) ─UNIX socket─ {pull: k, mapped} ─▶ for each part of k, as its packer publishes it:
                                                       take it from the store (the slab it lives in)
    map the slab (its fd rides along once),  ◀──────── {key: k#part<i>, slab, sizes, last} (+ fd)
    land views of it in the store
    ... the load copies them into the blocks;
    the last view dropped: ─────── release(slab) ────▶ the slab is free for the next publish

What the reader has mapped of a publisher's pooled slabs stays mapped across
pulls (keyed by the publisher's instance), so a part costs no new mapping and
no page faults after the first; a connection carries its reader's pulls one
after another. A pull's handle is ``DONE`` once the last part
has landed; it is ``FAILED``, and the reader's store marks the key failed, when
the publisher says the key failed or was discarded, when the connection breaks
(the publisher died), or past the deadline. A reader that dies breaks the
connection: the publisher abandons the slabs it had lent (never reused; the
memory goes with the last mapping). Published KV nobody pulls or takes is
dropped with the lease (the store's TTL) and its slab freed.

Only between endpoints of one host (``lends_to``); a reader elsewhere gets the
KV pushed (the prefill side sends the published views inline).
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import secrets
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import numpy.typing as npt

from tetriserve.transport import parts
from tetriserve.transport.api import Received, TransferHandle
from tetriserve.transport.tcp import TcpTransport, _recv_exact, split_views

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tetriserve.transport.shm import _Slab

logger = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
RELEASE = struct.Struct("!I")  # reader -> publisher: a slab id it no longer maps views of
_WAIT_S = 0.05  # the publisher's longest wait for the store to change before it looks again


class Published(list[Received]):
    """The views of one published key as its store entry holds them, with the slab they live in."""

    slab: _Slab


class Header(TypedDict, total=False):
    """A message over an shm endpoint's UNIX socket, as JSON: a push, a pull asked for, a part handed over, or
    the publisher's refusal; each kind carries some of these."""

    key: str  # push, part: the key (a part's) its views land under
    sizes: list[int]  # push, part: the bytes of each view, one after another in the slab
    slab: int  # push, part: the slab's id, and its size
    size: int
    pooled: bool  # push, part: a pooled slab (mapped once per connection), else a one-off
    last: bool  # part: the key's last
    instance: str  # pull, part: the publisher's instance (what the reader has mapped of it)
    pull: str  # pull: the key asked for, within deadline_s, with the publisher's slabs the reader has mapped
    deadline_s: float
    mapped: list[int]
    error: str  # the publisher's refusal of a pull


# what landing views of a slab gives: whether the store took them, and the finalizer that releases the slab
Landed = tuple[bool, "weakref.finalize[..., npt.NDArray[np.uint8]] | None"]


class ShmPublisher(TcpTransport):
    """Mixed into ``ShmTransport``: ``reserve``, ``publish``, ``lending``, ``lends_to``, and the publisher's side
    of a pull (``_serve_pull``); the reader's side is ``shm_pull_reader.py``. Built on ``TcpTransport`` as
    ``ShmTransport`` is, so ``ShmTransport``'s order of classes is itself, this, ``ShmReader``, ``TcpTransport``."""

    # ``ShmTransport``'s own, which this side uses
    _host_id: str
    _slab_lock: threading.Lock
    _slabs: dict[int, _Slab]
    _take_slab: Callable[[int], _Slab]
    _give_back: Callable[[_Slab], None]

    def _init_publisher(self, enabled: bool) -> None:
        self._pull_enabled = enabled
        self._instance = secrets.token_hex(8)  # tells a restarted publisher's slab ids from its predecessor's
        self._lend_lock = threading.Lock()
        self._lendings: dict[str, tuple[TransferHandle, float]] = {}  # key -> (its ``lending`` handle, deadline)

    # -- publisher ---------------------------------------------------------------------------
    def publish(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        """Park ``buffers`` under ``key`` as ``hold`` does, in a slab a reader on this host can map (``pull``)."""
        if isinstance(buffers, Published):  # filled in place (``reserve``): nothing to copy
            self._store.put(key, buffers, landed=False, expires=expires)
            return
        views = [memoryview(b).cast("B") for b in buffers]
        if not self._pull_enabled or sum(v.nbytes for v in views) == 0:
            self.hold(key, buffers, expires)
            return
        self._store.put(key, self._into_slab(views), landed=False, expires=expires)

    def reserve(self, sizes: list[int]) -> list[Received]:
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
        with self._lend_lock:
            expired = [k for k, (_, deadline) in self._lendings.items() if deadline <= now]
            stale = [self._lendings.pop(k)[0] for k in expired]
            self._lendings[key] = (handle, now + deadline_s)
        for h in stale:
            h.complete(f"{h.key} was not pulled within its deadline")
        return handle

    def _lent(self, key: str, nbytes: int = 0, done: bool = False, error: str | None = None) -> None:
        with self._lend_lock:
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

    def _serve_pull(self, conn: socket.socket, header: Header) -> bool:
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
                        send_frame(conn, {"error": why})
                        break
                    if self._closed.is_set():
                        return False
                    self._store.wait_newer(version, min(_WAIT_S, max(deadline - time.monotonic(), 0.0)))
                    continue
                part, held, last = found
                started, slab, nbytes = time.monotonic(), held.slab, sum(len(v) for v in held)  # 1-D bytes views
                where: Header = {"key": part, "sizes": [len(v) for v in held], "slab": slab.id, "size": slab.size,
                                 "pooled": slab.pooled, "last": last, "instance": self._instance}  # fmt: skip
                lent[slab.id] = held
                self._count_lent(nbytes)  # before the reader can see it
                send_frame(conn, where, None if slab.id in mapped else slab.fd)
                mapped.add(slab.id)
                with self._stats_lock:
                    self._send_s += time.monotonic() - started
                self._lent(key, nbytes, done=last)
                index += 1
            while lent:
                (sid,) = RELEASE.unpack(_recv_exact(conn, RELEASE.size))
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


def send_frame(conn: socket.socket, header: Header, fd: int | None = None) -> None:
    """One message over an shm endpoint's UNIX socket, push or pull: its length, its JSON; ``fd`` (a slab's, the
    first time the peer sees it) rides along."""
    frame = json.dumps(header).encode()
    frame = _LEN.pack(len(frame)) + frame
    if fd is None:
        conn.sendall(frame)
    else:
        socket.send_fds(conn, [frame], [fd])


def recv_frame(sock: socket.socket) -> tuple[Header, list[int]]:
    """The next message ``send_frame`` sent, and the descriptors that came with it."""
    head, fds, _, _ = socket.recv_fds(sock, _LEN.size, 1)
    if not head:
        raise ConnectionError("the peer closed the connection")
    head = bytes(head) + bytes(_recv_exact(sock, _LEN.size - len(head)))
    return json.loads(_recv_exact(sock, _LEN.unpack(head)[0])), fds


def map_slab(fds: list[int], size: int) -> mmap.mmap:
    """Map the slab whose descriptor came with a message (closing every descriptor that came)."""
    try:
        return mmap.mmap(fds[0], size)
    finally:
        for fd in fds:
            os.close(fd)
