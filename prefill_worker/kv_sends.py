"""The prefill worker's KV sends in flight (issue #16): each is polled, never waited on, and a failed one is
reported to its receiver at once (``kv_failed``: it frees its blocks and recomputes or fails the load) instead
of letting the decode worker wait out the transfer's deadline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tetriserve.common import tracing
from tetriserve.transport.api import TransferState

logger = logging.getLogger(__name__)

POLL_S = 0.05


async def watch_sends(
    worker_id: str,
    sends: dict[str, tuple[Any, str]],
    send_spans: dict[str, tracing.Span],
    decode_handles: dict[str, Any],
) -> None:
    """Forever: end each finished send (``sends``: KV key -> (handle, decode worker)) and its span; tell the
    decode worker of each failed one."""
    while True:
        await asyncio.sleep(POLL_S)
        for key, (handle, decode_id) in list(sends.items()):
            if handle.state is TransferState.PENDING:
                continue
            del sends[key]
            tracing.end(send_spans.pop(key, tracing.INVALID_SPAN), error=handle.error)
            if handle.state is TransferState.FAILED:
                logger.warning("prefill %s: KV send of %s failed: %s", worker_id, key, handle.error)
                decode = decode_handles.get(decode_id)
                if decode is not None:
                    decode.kv_failed.remote(key, handle.error or "send failed")
