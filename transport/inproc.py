"""In-process backend: endpoints in one Python process hand buffers to each other.

A real backend (copies bytes, honours deadlines, keeps stats), used by unit
tests and by single-process deployments. Addresses look like ``inproc://name``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tetriserve.transport.api import Buffer, Received, TransferHandle
from tetriserve.transport.store import StoreBackedEndpoint

_REGISTRY: dict[str, InProcTransport] = {}
_REGISTRY_LOCK = threading.Lock()


class InProcTransport(StoreBackedEndpoint):
    def __init__(self, name: str, ttl_s: float = 300.0) -> None:
        super().__init__(ttl_s)
        self._address = f"inproc://{name}"
        with _REGISTRY_LOCK:
            if self._address in _REGISTRY:
                raise ValueError(f"transport address {self._address} is already in use")
            _REGISTRY[self._address] = self

    @property
    def address(self) -> str:
        return self._address

    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        payload: list[Received] = [bytearray(b) for b in buffers]
        handle = TransferHandle(key, sum(len(b) for b in payload))
        with _REGISTRY_LOCK:
            peer = _REGISTRY.get(dst)
        if peer is None:
            error: str | None = f"no endpoint at {dst}"
        elif not peer._store.put(key, payload):
            error = f"receiver dropped {key} (discarded)"
        else:
            error = None
        self._finish(handle, error)
        return handle

    def close(self) -> None:
        with _REGISTRY_LOCK:
            _REGISTRY.pop(self._address, None)
