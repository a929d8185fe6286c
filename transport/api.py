"""The transport API every KV transfer backend implements (TetriInfer §3.3.4).

Two-sided backends implement ``send``/``recv``::

    sender                                   receiver
    h = t.send(dst, key, buffers, deadline)  ... t.recv(key) -> None (not yet)
    h.state  PENDING ─▶ DONE | FAILED        ... t.recv(key) -> [buf, buf, ...]

Nothing blocks the caller: ``send`` returns a handle that is polled, ``recv``
returns ``None`` until every byte of ``key`` has landed. Backpressure and
failure are states and return values, not exceptions. A transfer that breaks
is known on both sides at once: the sender's handle turns ``FAILED``, and the
receiver marks the key failed (``failed(key)`` says why) when the bytes stop
mid-transfer or when the sender tells it (``fail``), so nobody waits out a
deadline for bytes that will not come.

One-sided: a producer ``publish``es what a peer may take; a peer for which
``lends_to`` holds ``pull``s it, reading the producer's memory in place (``shm``
within a host, ``shm_pull.py``). Backends without it publish as they hold and
are pushed to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

Buffer = bytes | bytearray | memoryview
# what ``recv`` returns: writable, one-dimensional unsigned bytes; a memoryview where the backend hands over
# memory it mapped rather than copied (shm), so a consumer may read it in place (torch.frombuffer) or write it;
# what ``hold`` and ``publish`` park is of this kind too, since ``recv`` hands it back as it was parked
Received = bytearray | memoryview

logger = logging.getLogger(__name__)


class TransferState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class TransferHandle:
    """Progress of one ``send``; completed by the backend's I/O thread, polled by the caller."""

    def __init__(self, key: str, nbytes: int) -> None:
        self.key = key
        self.nbytes = nbytes
        self.started = time.monotonic()
        self.finished: float | None = None
        self.error: str | None = None
        self._state = TransferState.PENDING
        self._done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @classmethod
    def refused(cls, key: str, error: str) -> TransferHandle:
        """A handle that failed before anything moved (a closed endpoint, a backend that cannot do it)."""
        handle = cls(key, 0)
        handle.complete(error)
        return handle

    @property
    def state(self) -> TransferState:
        return self._state

    def complete(self, error: str | None = None) -> None:
        with self._lock:
            self.error = error
            self.finished = time.monotonic()
            self._state = TransferState.FAILED if error else TransferState.DONE
            callbacks, self._callbacks = self._callbacks, []
        self._done.set()
        for callback in callbacks:
            _run(callback)

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the transfer is over: at once if it is, otherwise on the thread that ends it
        (a backend's I/O thread: keep it short, e.g. ``loop.call_soon_threadsafe``)."""
        with self._lock:
            if self._state is TransferState.PENDING:
                self._callbacks.append(callback)
                return
        _run(callback)

    async def settled(self, timeout_s: float) -> TransferState:
        """Wait on the running event loop, at most ``timeout_s``, until the transfer is over; its state then."""
        if self._state is TransferState.PENDING:
            over: concurrent.futures.Future[None] = concurrent.futures.Future()
            self.on_done(lambda: over.set_result(None))  # once; asyncio's bridge wakes the loop (if still open)
            await asyncio.wait([asyncio.wrap_future(over)], timeout=timeout_s)
        return self._state

    def wait(self, timeout: float | None = None) -> TransferState:
        """For tests and shutdown only: it blocks. Engine loops poll ``state``; event loops await ``settled``."""
        self._done.wait(timeout)
        return self._state


def _run(callback: Callable[[], None]) -> None:
    """A transfer's completion callback, on whichever thread ends it: its failure is logged, never raised into
    the backend's I/O thread."""
    try:
        callback()
    except Exception:
        logger.exception("a transfer's completion callback failed")


@dataclass(frozen=True)
class TransportStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    transfers_sent: int = 0
    transfers_received: int = 0
    transfers_failed: int = 0
    expired: int = 0
    seconds_sending: float = 0.0  # summed over completed sends, ``send`` to acknowledgement (a part lent: hand-over)
    transfers_pulled: int = 0  # keys pulled whole from publishers (one-sided; their parts count as received)

    @property
    def send_gbps(self) -> float:
        """The average rate of the completed sends, GB/s (0 before any)."""
        return self.bytes_sent / self.seconds_sending / 1e9 if self.seconds_sending > 0 else 0.0


class Transport(Protocol):
    """A two-sided transport endpoint, addressable by ``address``."""

    @property
    def address(self) -> str: ...

    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle: ...

    def recv(self, key: str) -> list[Received] | None: ...

    def landed(self, key: str) -> bool:
        """Whether every byte of ``key`` is here (``recv`` would return it), without taking it."""
        ...

    def landed_bytes(self, key: str) -> int | None:
        """How many bytes ``recv(key)`` would return, without taking them; None unless all are here."""
        ...

    def hold(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        """Deposit ``buffers`` under ``key`` in this endpoint's own landing area, as if they had arrived.

        Lets a producer park data before it knows where it goes, then ``recv`` + ``send`` it later.
        ``expires=False`` keeps it past the landing area's TTL, for an owner that always takes or
        discards it (a swapped-out request's KV).
        """
        ...

    def reserve(self, sizes: list[int]) -> list[Received]:
        """Writable buffers of ``sizes`` bytes to fill and then ``publish``: where the backend has a pull, in the
        memory a peer reads (one ``shm`` slab), so publishing them copies nothing."""
        ...

    def publish(self, key: str, buffers: Sequence[Received], expires: bool = True) -> None:
        """``hold``, and where the backend offers a one-sided pull (``shm`` within a host: ``shm_pull.py``) in
        memory a peer reads in place: a peer for which ``lends_to`` holds ``pull``s it without a ``send``."""
        ...

    def lends_to(self, dst: str) -> bool:
        """Whether the endpoint at ``dst`` can ``pull`` what this one publishes."""
        ...

    def lending(self, key: str, deadline_s: float) -> TransferHandle:
        """The publisher's handle on a reader's ``pull`` of ``key``, as ``send`` gives one on a push: ``DONE`` once
        the last part is handed over, ``FAILED`` if the pull fails or none comes within ``deadline_s``."""
        ...

    def pull(self, src: str, key: str, deadline_s: float) -> TransferHandle | None:
        """One-sided: bring ``key`` (every part, as it is published) from the endpoint at ``src`` into this
        endpoint's landing area, where ``recv`` finds it; a handle (``DONE`` once the last part landed), or None
        where this backend cannot pull from ``src``."""
        ...

    def discard(self, key: str) -> bool:
        """Drop received (or late-arriving) data for ``key``; True if something was dropped."""
        ...

    def fail(self, key: str, reason: str) -> None:
        """Note that ``key`` will not land (its sender failed); ``failed`` reports it until taken or discarded.
        Data that has fully landed stays."""
        ...

    def failed(self, key: str) -> str | None:
        """Why ``key`` will not land, if this endpoint knows it will not."""
        ...

    def stats(self) -> TransportStats: ...

    def close(self) -> None: ...


WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def advertised_host(host: str) -> str:
    """The address peers reach an endpoint bound to ``host`` at: ``host`` itself, or for a wildcard bind (every
    interface, as in a Kubernetes pod) this host's outward address (the interface a route to the outside
    leaves from; no packet is sent), 127.0.0.1 if it has none."""
    if host not in WILDCARD_HOSTS:
        return host
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
