"""Landing area for received transfers, shared by the two-sided backends.

A key is taken exactly once; a key whose KV came in parts (``parts.py``) is
there once all its parts are, and is taken with them. Data for a discarded key (an aborted request),
its parts included, is dropped when it lands; a key whose transfer broke is marked failed (with
the reason) until someone discards it or the TTL passes; data nobody takes within ``ttl_s`` expires, so an
orphaned transfer cannot pin memory forever. Data held with ``expires=False``
(a swapped-out request's KV, whose owner discards it) stays until taken or
discarded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tetriserve.transport import parts
from tetriserve.transport.api import Received, TransferHandle, TransferState, TransportStats


@dataclass
class _Entry:
    buffers: list[Received]  # bytearray or views of landing memory when received, the producer's when held
    landed: float
    expires: bool = True


class ReceiveStore:
    def __init__(self, ttl_s: float = 300.0) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._parts: dict[str, set[str]] = {}  # key -> the keys of its parts here (``parts.py``)
        self._discarded: dict[str, float] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        self._changed = threading.Condition(self._lock)  # notified on every put, take, fail and discard
        self._version = 0
        self.bytes_received = 0
        self.transfers_received = 0
        self.expired = 0

    def put(self, key: str, buffers: list[Received], *, landed: bool = True, expires: bool = True) -> bool:
        """Store a transfer (``landed=False``: deposited locally, not counted as received; ``expires=False``:
        kept past the TTL until taken or discarded); False if the key was discarded beforehand."""
        with self._lock:
            self._expire_locked()
            if self._discarded.pop(key, None) is not None or parts.base_of(key) in self._discarded:
                return False
            self._failed.pop(key, None)
            self._entries[key] = _Entry(buffers, time.monotonic(), expires)
            self._bump_locked()
            if (base := parts.base_of(key)) != key:
                self._parts.setdefault(base, set()).add(key)
            if landed:
                self.bytes_received += sum(len(b) for b in buffers)
                self.transfers_received += 1
            return True

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def take(self, key: str) -> list[Received] | None:
        with self._lock:
            self._expire_locked()
            entry = self._pop_locked(key)
            if entry is not None:
                return entry.buffers
            whole = parts.complete(key, self._parts.get(key, ()))
            if whole is None:
                return None
            taken = [self._pop_locked(k) for k in whole]
            return [buf for e in taken if e is not None for buf in e.buffers]

    def take_exact(self, key: str) -> list[Received] | None:
        """What was put under exactly ``key`` (one part, not a whole assembled from parts), as it was put."""
        with self._lock:
            self._expire_locked()
            entry = self._pop_locked(key)
            return entry.buffers if entry is not None else None

    def dropped(self, key: str) -> str | None:
        """Why ``key`` will not be here, if it was discarded (what lands for it is dropped)."""
        with self._lock:
            return f"{key} was discarded" if key in self._discarded else None

    def version(self) -> int:
        """Changes whenever something is put, taken, failed or discarded (``wait_newer``)."""
        with self._lock:
            return self._version

    def wait_newer(self, version: int, timeout_s: float) -> None:
        """Block until the store changed since ``version`` was read, or ``timeout_s`` passed."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout_s)

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._entries or parts.complete(key, self._parts.get(key, ())) is not None

    def size(self, key: str) -> int | None:
        """The bytes ``take(key)`` would return, None unless all of them (every part) are here."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return sum(len(b) for b in entry.buffers)
            whole = parts.complete(key, self._parts.get(key, ()))
            if whole is None:
                return None
            return sum(len(b) for k in whole for b in self._entries[k].buffers)

    def fail(self, key: str, reason: str) -> None:
        with self._lock:
            for k in {key, parts.base_of(key)}:  # a part that fails fails its whole key
                if k not in self._entries and k not in self._discarded:
                    self._failed[k] = (time.monotonic(), reason)
            self._bump_locked()

    def failed(self, key: str) -> str | None:
        with self._lock:
            entry = self._failed.get(key)
            return None if entry is None else entry[1]

    def discard(self, key: str) -> bool:
        with self._lock:
            self._expire_locked()
            self._bump_locked()
            self._failed.pop(key, None)
            if self._pop_locked(key) is not None:
                return True
            self._discarded[key] = time.monotonic()  # and so its parts still to land
            dropped = list(self._parts.get(key, ()))
            for k in dropped:
                self._pop_locked(k)
            return bool(dropped)

    def __len__(self) -> int:
        with self._lock:
            self._expire_locked()
            return len(self._entries)

    def _bump_locked(self) -> None:
        self._version += 1
        self._changed.notify_all()

    def _pop_locked(self, key: str) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bump_locked()
        base = parts.base_of(key)
        if entry is not None and base != key:
            group = self._parts[base]
            group.discard(key)
            if not group:
                del self._parts[base]
        return entry

    def _expire_locked(self) -> None:
        now = time.monotonic()
        for key in [k for k, e in self._entries.items() if e.expires and now - e.landed > self._ttl_s]:
            self._pop_locked(key)
            self.expired += 1
        for key in [k for k, t in self._discarded.items() if now - t > self._ttl_s]:
            del self._discarded[key]
        for key in [k for k, (t, _) in self._failed.items() if now - t > self._ttl_s]:
            del self._failed[key]


class StoreBackedEndpoint:
    """Receive side shared by two-sided backends: a ``ReceiveStore`` plus send counters (under ``_stats_lock``)."""

    def __init__(self, ttl_s: float, store: ReceiveStore | None = None) -> None:
        """``store``: another endpoint's, for two listeners that land into one place (``transport/auto.py``)."""
        self._store = store if store is not None else ReceiveStore(ttl_s)
        self._stats_lock = threading.Lock()
        self._bytes_sent = 0
        self._sent = 0
        self._failed = 0
        self._send_s = 0.0
        self._pulled = 0  # keys pulled whole (``pull``, where the backend has it)

    def _finish(self, handle: TransferHandle, error: str | None) -> None:
        """Complete a send exactly once and count its outcome."""
        with self._stats_lock:
            if handle.state is not TransferState.PENDING:
                return
            handle.complete(error)
            if error is None:
                self._sent += 1
                self._bytes_sent += handle.nbytes
                self._send_s += (handle.finished or handle.started) - handle.started
            else:
                self._failed += 1

    @property
    def store(self) -> ReceiveStore:
        return self._store

    def recv(self, key: str) -> list[Received] | None:
        return self._store.take(key)

    def landed(self, key: str) -> bool:
        return self._store.has(key)

    def landed_bytes(self, key: str) -> int | None:
        return self._store.size(key)

    def discard(self, key: str) -> bool:
        return self._store.discard(key)

    def fail(self, key: str, reason: str) -> None:
        self._store.fail(key, reason)

    def failed(self, key: str) -> str | None:
        return self._store.failed(key)

    def hold(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        self._store.put(key, list(buffers), landed=False, expires=expires)

    def reserve(self, sizes: list[int]) -> list[Received]:
        """Writable buffers to fill and ``publish``: fresh memory, on a backend with no one-sided pull."""
        return [memoryview(bytearray(n)) for n in sizes]

    def publish(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        """``hold``, on a backend with no one-sided pull."""
        self.hold(key, buffers, expires)

    def lends_to(self, dst: str) -> bool:
        return False

    def lending(self, key: str, deadline_s: float) -> TransferHandle:
        return TransferHandle.refused(key, f"{key}: this backend has no pull")

    def pull(self, src: str, key: str, deadline_s: float) -> TransferHandle | None:
        return None

    def stats(self) -> TransportStats:
        s = self._store
        with self._stats_lock:
            return TransportStats(
                self._bytes_sent,
                s.bytes_received,
                self._sent,
                s.transfers_received,
                self._failed,
                s.expired,
                self._send_s,
                self._pulled,
            )
