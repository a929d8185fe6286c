"""Multiplexed output streams: a worker's token deltas for many requests, one stream per front door.

Sending every token of every request as its own message costs one message per
request per engine step; with tens of running requests that overhead, not the
engine, bounds the time per output token. So a worker keeps one ``Outbox`` per
subscriber (front door) and the subscriber drains it through one long-lived
stream: each pull returns everything that accumulated since the last one, with
consecutive deltas of the same request coalesced into one chunk. The message
rate follows the engine's step rate whatever the batch size, and a slow
subscriber gets bigger batches rather than holding up the worker or the other
subscribers (there is no blocking bound shared by the requests of a stream).

Chunks published before the subscriber attaches wait in its outbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from tetriserve.common.stream import StreamChunk


def coalesce(chunks: list[StreamChunk]) -> list[StreamChunk]:
    """Merge each run of contiguous deltas of one request (same worker and attempt, no finish before the last)
    into one chunk; ``moved_to`` markers stay chunks of their own; order within a request is kept."""
    out: list[StreamChunk] = []
    last: dict[str, int] = {}  # request id -> position of its newest chunk in ``out``
    for chunk in chunks:
        pos = last.get(chunk.request_id, -1)
        prev = out[pos] if pos >= 0 else None
        if (
            prev is not None
            and prev.finish_reason is None
            and prev.moved_to is None
            and chunk.moved_to is None
            and prev.worker == chunk.worker
            and prev.attempt == chunk.attempt
            and prev.end == chunk.index
            and not prev.metrics
        ):
            out[pos] = replace(chunk, token_ids=prev.token_ids + chunk.token_ids, index=prev.index)
            continue
        last[chunk.request_id] = len(out)
        out.append(chunk)
    return out


class Outbox:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[StreamChunk] = asyncio.Queue()

    def put(self, chunk: StreamChunk) -> None:
        self._queue.put_nowait(chunk)

    async def batches(self) -> AsyncIterator[list[StreamChunk]]:
        """Forever: wait for at least one chunk, then yield all that are ready, coalesced."""
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            yield coalesce(batch)


class StreamHub:
    """A worker's outboxes, one per subscriber (front door)."""

    def __init__(self) -> None:
        self._outboxes: dict[str, Outbox] = {}
        self._attached: set[str] = set()

    def publish(self, subscriber: str, chunk: StreamChunk) -> None:
        outbox = self._outboxes.get(subscriber)
        if outbox is None:  # not ``setdefault(..., Outbox())``: that would build a queue for every chunk
            outbox = self._outboxes[subscriber] = Outbox()
        outbox.put(chunk)

    async def subscribe(self, subscriber: str) -> AsyncIterator[list[StreamChunk]]:
        """The subscriber's one stream: batches of chunks of every request it submitted here. One stream per
        subscriber at a time; its outbox is dropped when the stream ends."""
        if subscriber in self._attached:
            raise ValueError(f"subscriber {subscriber} already has a stream open")
        self._attached.add(subscriber)
        outbox = self._outboxes.setdefault(subscriber, Outbox())
        try:
            async for batch in outbox.batches():
                yield batch
        finally:
            self._attached.discard(subscriber)
            self._outboxes.pop(subscriber, None)
