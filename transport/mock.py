"""TetriInfer's transfer mock (§4): only the metadata travels; the receiver gets zero-filled KV of the right size.

    transport: {backend: mock, emulate: {gbps: 400, latency_us: 2}}

For studying links faster than this machine's: with ``emulate`` (required) each
transfer takes the emulated link's time for its full size, while only the KV
codec's headers (each part's first buffer: layer names, shapes) cross over TCP with
the sizes of the rest. The decode engine then loads zeros for the prompt's KV, so
its tokens are not the model's: latency and throughput studies only, never
serving. Parked KV held in an endpoint (``hold``) is the real KV.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tetriserve.transport import kv_codec
from tetriserve.transport.api import Buffer, Received, TransferHandle
from tetriserve.transport.tcp import TcpTransport

_MARK = b"TSMOCK"


class MockTransport(TcpTransport):
    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        if not buffers:
            return super().send(dst, key, buffers, deadline_s)
        headers = _header_positions(buffers)
        sizes = [None if i in headers else memoryview(b).nbytes for i, b in enumerate(buffers)]
        frame = _MARK + json.dumps(sizes).encode()
        return super().send(dst, key, [frame, *(buffers[i] for i in sorted(headers))], deadline_s)

    def recv(self, key: str) -> list[Received] | None:
        got = super().recv(key)
        if not got or bytes(got[0][: len(_MARK)]) != _MARK:
            return got  # held locally, or not a mock frame
        sizes = json.loads(bytes(got[0][len(_MARK) :]))
        headers = iter(got[1:])
        return [next(headers) if n is None else bytearray(n) for n in sizes]


def _header_positions(buffers: Sequence[Buffer]) -> set[int]:
    """Where the KV codec's headers sit among ``buffers``: each part's first buffer (``transport/parts.py``);
    only the first where ``buffers`` are not the codec's."""
    try:
        pieces = kv_codec.split_parts(buffers)
    except (ValueError, KeyError, TypeError):
        return {0}
    out: set[int] = set()
    at = 0
    for _, layer_bufs in pieces:
        out.add(at)
        at += 1 + len(layer_bufs)
    return out
