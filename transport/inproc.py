"""In-process backend: endpoints in one Python process hand buffers to each other.

A real backend (copies bytes, honours deadlines, keeps stats), used by unit
tests and by single-process deployments. Addresses look like ``inproc://name``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from transport.api import Buffer, TransferHandle, TransportStats
from transport.store import ReceiveStore

_REGISTRY: dict[str, InProcTransport] = {}
_REGISTRY_LOCK = threading.Lock()


class InProcTransport:
    def __init__(self, name: str, ttl_s: float = 300.0) -> None:
        self._address = f"inproc://{name}"
        self._store = ReceiveStore(ttl_s)
        self._sent = 0
        self._bytes_sent = 0
        self._failed = 0
        with _REGISTRY_LOCK:
            if self._address in _REGISTRY:
                raise ValueError(f"transport address {self._address} is already in use")
            _REGISTRY[self._address] = self

    @property
    def address(self) -> str:
        return self._address

    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        payload = [bytearray(b) for b in buffers]
        handle = TransferHandle(key, sum(len(b) for b in payload))
        with _REGISTRY_LOCK:
            peer = _REGISTRY.get(dst)
        if peer is None:
            self._failed += 1
            handle.complete(f"no endpoint at {dst}")
            return handle
        if not peer._store.put(key, payload):
            self._failed += 1
            handle.complete(f"receiver dropped {key} (discarded)")
            return handle
        self._sent += 1
        self._bytes_sent += handle.nbytes
        handle.complete()
        return handle

    def recv(self, key: str) -> list[bytearray] | None:
        return self._store.take(key)

    def discard(self, key: str) -> bool:
        return self._store.discard(key)

    def hold(self, key: str, buffers: Sequence[Buffer]) -> None:
        self._store.put(key, list(buffers), landed=False)

    def stats(self) -> TransportStats:
        s = self._store
        return TransportStats(
            self._bytes_sent, s.bytes_received, self._sent, s.transfers_received, self._failed, s.expired
        )

    def close(self) -> None:
        with _REGISTRY_LOCK:
            _REGISTRY.pop(self._address, None)
