"""Link emulation: any real backend shaped to a slower link (TetriInfer §4 studies links this way).

    transport: {backend: shm, emulate: {gbps: 10, latency_us: 50}}

Each sending endpoint has one emulated link. A transfer of ``n`` bytes occupies
it for ``n·8 / gbps`` after the transfers queued before it, then arrives
``latency_us`` later; only then does the real backend send it, so the receiver
sees it land when it would have over that link (plus the real, faster path's
own time). The sender's handle completes when the real send does. A transfer
whose emulated arrival falls past its deadline fails at the deadline, as a real
slow link would make it. Receiving is the real backend's.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from tetriserve.transport.api import Buffer, Received, TransferHandle, TransferState, Transport, TransportStats


class EmulatedLink:
    def __init__(self, inner: Transport, gbps: float, latency_us: float = 0.0) -> None:
        if gbps <= 0:
            raise ValueError(f"transport.emulate.gbps must be > 0, got {gbps}")
        self.inner = inner
        self.bytes_per_s = gbps * 1e9 / 8
        self.latency_s = latency_us / 1e6
        self._lock = threading.Condition()
        self._link_free_at = 0.0
        # (when, seq, action, its send) heap
        self._due: list[tuple[float, int, Callable[[], object], TransferHandle]] = []
        self._seq = itertools.count()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kv-link")
        threading.Thread(target=self._run, name="kv-link", daemon=True).start()

    @property
    def address(self) -> str:
        return str(self.inner.address)

    def arrival(self, nbytes: int, now: float) -> float:
        """When ``nbytes`` sent at ``now`` arrive over the emulated link (books the link for them)."""
        with self._lock:
            start = max(now, self._link_free_at)
            self._link_free_at = start + nbytes / self.bytes_per_s
            return self._link_free_at + self.latency_s

    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        views = [memoryview(b).cast("B") for b in buffers]
        handle = TransferHandle(key, sum(v.nbytes for v in views))
        now = time.monotonic()
        deadline = now + deadline_s
        at = self.arrival(handle.nbytes, now)
        if at > deadline:
            error = f"send {key} failed: the emulated link needs {at - now:.3f} s, past its deadline"
            self._at(deadline, handle, lambda: handle.complete(error))
        else:
            self._at(at, handle, lambda: self._pool.submit(self._forward, dst, key, views, deadline, handle))
        return handle

    def _forward(self, dst: str, key: str, views: list[memoryview], deadline: float, handle: TransferHandle) -> None:
        real = self.inner.send(dst, key, views, max(deadline - time.monotonic(), 0.001))
        real.wait(max(deadline - time.monotonic(), 0.001) + 1.0)
        handle.complete(None if real.state is TransferState.DONE else real.error or "send failed")

    def _at(self, when: float, handle: TransferHandle, fn: Callable[[], object]) -> None:
        with self._lock:
            heapq.heappush(self._due, (when, next(self._seq), fn, handle))
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._lock.wait(None if not self._due else max(self._due[0][0] - time.monotonic(), 0.0))
                if self._closed:
                    return
                _, _, fn, _ = heapq.heappop(self._due)
            fn()

    # -- the rest is the real backend's ------------------------------------------------------
    def recv(self, key: str) -> list[Received] | None:
        return self.inner.recv(key)

    def landed(self, key: str) -> bool:
        return bool(self.inner.landed(key))

    def landed_bytes(self, key: str) -> int | None:
        return self.inner.landed_bytes(key)

    def hold(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        self.inner.hold(key, buffers, expires)

    def reserve(self, sizes: list[int]) -> list[Received]:
        return [memoryview(bytearray(n)) for n in sizes]  # held, then pushed over the emulated link

    def publish(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        self.inner.hold(key, buffers, expires)  # pushed over the emulated link: nobody pulls it

    def lends_to(self, dst: str) -> bool:
        return False  # a pull would bypass the emulated link

    def lending(self, key: str, deadline_s: float) -> TransferHandle:
        return TransferHandle.refused(key, f"{key}: an emulated link is never pulled over")

    def pull(self, src: str, key: str, deadline_s: float) -> TransferHandle | None:
        return None

    def discard(self, key: str) -> bool:
        return bool(self.inner.discard(key))

    def fail(self, key: str, reason: str) -> None:
        self.inner.fail(key, reason)

    def failed(self, key: str) -> str | None:
        return self.inner.failed(key)

    def stats(self) -> TransportStats:
        return self.inner.stats()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._due = self._due, []
            self._lock.notify()
        for _, _, _, handle in pending:  # still on the emulated link
            if handle.state is TransferState.PENDING:
                handle.complete("transport closed")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.inner.close()
