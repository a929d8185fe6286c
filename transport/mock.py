"""TetriInfer's transfer mock (§4): only the metadata travels; the receiver gets zero-filled KV of the right size.

    transport: {backend: mock, emulate: {gbps: 400, latency_us: 2}}

For studying links faster than this machine's: with ``emulate`` (required) each
transfer takes the emulated link's time for its full size, while only the KV
codec's header (the first buffer: layer names, shapes) crosses over TCP with the
sizes of the rest. The decode engine then loads zeros for the prompt's KV, so
its tokens are not the model's: latency and throughput studies only, never
serving. Parked KV held in an endpoint (``hold``) is the real KV.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tetriserve.transport.api import Buffer, TransferHandle
from tetriserve.transport.tcp import TcpTransport

_MARK = b"TSMOCK"


class MockTransport(TcpTransport):
    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        if not buffers:
            return super().send(dst, key, buffers, deadline_s)
        sizes = [memoryview(b).nbytes for b in buffers[1:]]
        return super().send(dst, key, [buffers[0], _MARK + json.dumps(sizes).encode()], deadline_s)

    def recv(self, key: str) -> list[Any] | None:
        got = super().recv(key)
        if got is None or len(got) != 2 or bytes(got[1][: len(_MARK)]) != _MARK:
            return got  # held locally, or not a mock frame
        sizes = json.loads(bytes(got[1][len(_MARK) :]))
        return [got[0], *(bytearray(n) for n in sizes)]
