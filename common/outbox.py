"""A multiplexed output stream: token deltas of many requests, delivered in batches.

Relaying every token of every request as its own message costs one message per
request per engine step; with tens of running requests that overhead, not the
engine, bounds the time per output token. An ``Outbox`` is drained by one
subscriber: each pull returns everything that accumulated since the last one,
so the message rate follows the engine's step rate whatever the batch size.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from common.stream import StreamChunk


class Outbox:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[StreamChunk] = asyncio.Queue()

    def put(self, chunk: StreamChunk) -> None:
        self._queue.put_nowait(chunk)

    def __len__(self) -> int:
        return self._queue.qsize()

    async def batches(self) -> AsyncIterator[list[StreamChunk]]:
        """Forever: wait for at least one chunk, then yield all that are ready."""
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            yield batch
