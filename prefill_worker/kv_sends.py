"""The prefill worker's KV sends: each in flight is polled, never waited on, and a failed one is
reported to its receiver at once (``kv_failed``: it frees its blocks and recomputes or fails the load) instead
of letting the decode worker wait out the transfer's deadline. A pipelined handoff (``pipeline.py``) sends a
prompt's KV part by part while its later chunks compute (``forward_parts``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tetriserve.channel.handoff import KvFailed
from tetriserve.observability import tracing
from tetriserve.transport import parts
from tetriserve.transport.api import TransferState

if TYPE_CHECKING:
    from tetriserve.prefill_worker.decode_peers import DecodePeer

logger = logging.getLogger(__name__)

POLL_S = 0.05
PART_POLL_S = 0.005  # a pipelined handoff's look for the next part while the prefill still runs


async def watch_sends(
    worker_id: str,
    sends: dict[str, tuple[Any, str]],
    send_spans: dict[str, tracing.Span],
    decode_peers: dict[str, DecodePeer],
) -> None:
    """Forever: end each finished send (``sends``: KV key -> (handle, decode worker)) and its span; tell the
    decode worker of each failed one."""
    while True:
        await asyncio.sleep(POLL_S)
        for key, (handle, decode_id) in list(sends.items()):
            if handle.state is TransferState.PENDING:
                continue
            del sends[key]
            span = send_spans.pop(key, tracing.INVALID_SPAN)  # a pull's bytes are known once it is over
            tracing.end(span, {"tetriserve.kv.bytes": handle.nbytes}, error=handle.error)
            if handle.state is TransferState.FAILED:
                logger.warning("prefill %s: KV send of %s failed: %s", worker_id, key, handle.error)
                decode = decode_peers.get(decode_id)
                if decode is not None:
                    decode.send(KvFailed(key, handle.error or "send failed"))


async def forward_parts(
    endpoint: Any,
    key: str,
    address: str,
    timeout_s: float,
    give_up: Callable[[], bool],
    on_send: Callable[[str, Any], None],
    hurry: asyncio.Event,
) -> str | None:
    """Send ``key``'s KV to ``address`` part by part as the engine's packer parks them (``transport/parts.py``),
    up to and including the last part: the parts of the chunks computed so far at once, each later one as soon as
    it is parked. ``on_send(part key, handle)`` for each send; returns an error message, or None once the last
    part is on its way. It looks for the next part every ``PART_POLL_S`` while the prefill runs (a chunk takes
    longer than that) and every millisecond once ``hurry`` is set (the first token is out: the last part is
    being packed)."""
    deadline = time.monotonic() + timeout_s
    index = 0
    while True:
        found = _take_part(endpoint, key, index)
        if found is not None:
            part, buffers = found
            on_send(part, endpoint.send(address, part, buffers, timeout_s))
            if parts.is_last(part):
                return None
            index += 1
            continue
        if give_up():
            return f"request of {key} was aborted"
        if (why := endpoint.failed(key)) is not None:
            return why
        if time.monotonic() >= deadline:
            return f"prefilled KV of {key} was not parked within {timeout_s:.0f} s"
        if hurry.is_set():
            await asyncio.sleep(0.001)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hurry.wait(), PART_POLL_S)


def _take_part(endpoint: Any, key: str, index: int) -> tuple[str, Any] | None:
    """Part ``index`` of ``key`` (its key and buffers), last or not, if the packer has parked it."""
    for last in (False, True):
        part = parts.part_key(key, index, last)
        if (buffers := endpoint.recv(part)) is not None:
            return part, buffers
    return None
