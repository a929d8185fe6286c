"""Multiplexed output streams: a worker's token deltas for many requests, one stream per front door.

Sending every token of every request as its own message costs one message per
request per engine step; with tens of running requests that overhead, not the
engine, bounds the time per output token. So a worker keeps one stream per
subscriber (front door): every chunk published in one turn of the worker's
event loop (an engine step's deltas arrive in one turn) leaves as one message,
with consecutive deltas of the same request coalesced into one chunk. The
message rate follows the engine's step rate whatever the batch size, and a slow
subscriber gets a longer queue rather than holding up the worker or the other
subscribers (there is no blocking bound shared by the requests of a stream).

The wire is the channel (``channel/core.py``): a ``Sender`` from the worker to the
front door's one ``Endpoint``, each message one ``Chunks`` batch; one connection per
worker keeps a worker's chunks in order. Ray carries the control side: the
front door's long-lived ``subscribe`` call (``serve`` here) attaches the socket
and then yields only a heartbeat every ``HEARTBEAT_S``; that call ending tells
each side the other is gone. Tokens do not go through Ray's streaming
generators because each of their messages costs about 0.8 ms of CPU on the
sending side and 1.1 ms on the receiving side on 2 cores, against about 0.2 ms and
0.3 ms for ZeroMQ (``python benchmarks/diagnostics/stream_channel.py --messages
2000 --rounds 3``), and the sending side is the process whose engine thread
shares its GIL.

Chunks published before the subscriber attaches wait until it does.

A decode engine's thread sends its step's token chunks itself (``stage`` each, then ``send_staged``), without
waking the worker's event loop: the hub's lock orders them with what the loop publishes, whatever was published
before them going first. A sink that is not thread-safe (an in-process subscriber's queue) gets them from the
event loop instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from tetriserve.channel import core
from tetriserve.common.stream import StreamChunk

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # how often an idle control stream proves both ends are alive

Sink = Callable[[list[StreamChunk]], None]
Beat = TypeVar("Beat")


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
            and (prev.logprobs is None) == (chunk.logprobs is None)
        ):
            logprobs = None if prev.logprobs is None or chunk.logprobs is None else prev.logprobs + chunk.logprobs
            out[pos] = replace(chunk, token_ids=prev.token_ids + chunk.token_ids, index=prev.index, logprobs=logprobs)
            continue
        last[chunk.request_id] = len(out)
        out.append(chunk)
    return out


@core.message(21)
@dataclass(frozen=True)
class Chunks:
    """One batch of a worker's chunks for one front door."""

    chunks: tuple[StreamChunk, ...]


STREAM_MESSAGES: tuple[type[Chunks], ...] = (Chunks,)


class ChannelSink:
    """Sends batches to one front door's endpoint at ``address`` (``tcp://host:port``), never blocking."""

    def __init__(self, address: str) -> None:
        self._sender = core.Sender(address)

    def __call__(self, chunks: list[StreamChunk]) -> None:
        self._sender.send(Chunks(tuple(chunks)))

    def close(self) -> None:
        self._sender.close()


class StreamHub:
    """A worker's streams, one per subscriber (front door). ``publish`` and ``attach`` from the worker's event loop
    only; ``stage`` and ``send_staged`` from one other thread (the engine's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the pending chunks, the sinks, and the sockets behind them
        self._pending: dict[str, list[StreamChunk]] = {}
        self._sinks: dict[str, tuple[Sink, bool]] = {}  # subscriber -> (sink, whether any thread may call it)
        self._staged: dict[str, list[StreamChunk]] = {}  # the engine thread's own, until send_staged
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_due = False

    def publish(self, subscriber: str, chunk: StreamChunk) -> None:
        with self._lock:
            pending = self._pending.get(subscriber)
            if pending is None:  # not ``setdefault(..., [])``: that would build a list for every chunk
                pending = self._pending[subscriber] = []
            pending.append(chunk)
            due = not self._flush_due and subscriber in self._sinks
            self._flush_due |= due
        if due:
            asyncio.get_running_loop().call_soon(self._flush)

    def stage(self, subscriber: str, chunk: StreamChunk) -> None:
        """Engine thread: ``chunk`` goes with this step's others at ``send_staged``."""
        staged = self._staged.get(subscriber)
        if staged is None:
            staged = self._staged[subscriber] = []
        staged.append(chunk)

    def send_staged(self) -> None:
        """Engine thread: send what was staged, one message per subscriber, after what was published before it."""
        if not self._staged:
            return
        staged, self._staged = self._staged, {}
        wake = False
        with self._lock:
            for subscriber, chunks in staged.items():
                pending = self._pending.pop(subscriber, None)
                batch = chunks if pending is None else pending + chunks
                sink, threadsafe = self._sinks.get(subscriber, (None, False))
                if sink is not None and threadsafe:
                    self._send(subscriber, sink, batch)
                else:  # not attached yet, or its sink is the loop's own: the loop sends it
                    self._pending[subscriber] = batch
                    wake |= sink is not None
            wake &= not self._flush_due  # a flush already queued takes these too
            self._flush_due |= wake
        if wake and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop has closed: nobody reads these
                logger.debug("stream chunks dropped: the worker's event loop is closed")

    def _flush(self) -> None:
        with self._lock:
            self._flush_due = False
            for subscriber, (sink, _) in self._sinks.items():
                chunks = self._pending.pop(subscriber, None)
                if chunks:
                    self._send(subscriber, sink, chunks)

    @staticmethod
    def _send(subscriber: str, sink: Sink, chunks: list[StreamChunk]) -> None:
        try:
            sink(coalesce(chunks))
        except Exception:  # one subscriber's broken socket must not cost the others their chunks
            logger.exception("stream to %s failed; %d chunks dropped", subscriber, len(chunks))

    @contextmanager
    def attach(self, subscriber: str, sink: Sink, threadsafe: bool = False) -> Iterator[None]:
        """Send ``subscriber``'s chunks to ``sink`` while the ``with`` lasts (what waited goes at once).

        One sink per subscriber at a time, the newest: a subscriber that attaches again while its earlier stream
        is open (a front door that took that stream for broken and opened another) takes its chunks over at once,
        and the earlier ``with`` then leaves them alone when it ends. What is still unsent when the subscriber's
        current sink detaches is dropped. ``threadsafe``: the engine thread may call ``sink`` itself (else it is
        called on this event loop only)."""
        self._loop = asyncio.get_running_loop()
        entry = (sink, threadsafe)
        with self._lock:
            self._sinks[subscriber] = entry
        try:
            self._flush()
            yield
        finally:
            with self._lock:
                if self._sinks.get(subscriber) is entry:  # not taken over by a newer stream
                    del self._sinks[subscriber]
                    self._pending.pop(subscriber, None)

    def current(self, subscriber: str, sink: Sink) -> bool:
        """Whether ``sink`` is the one ``subscriber``'s chunks go to (not detached, not taken over)."""
        entry = self._sinks.get(subscriber)
        return entry is not None and entry[0] is sink

    def attached(self, subscriber: str) -> bool:
        """Whether any stream of ``subscriber``'s is open."""
        return subscriber in self._sinks

    async def serve(
        self, subscriber: str, address: str, beat: Callable[[], Beat], heartbeat_s: float = HEARTBEAT_S
    ) -> AsyncIterator[Beat]:
        """The worker's side of a front door's ``subscribe``: chunks go to the front door's socket at
        ``address``; this stream yields ``beat()`` at once and every ``heartbeat_s`` until the caller drops it,
        or until a newer stream of the same subscriber takes its chunks over (then it ends)."""
        sink = ChannelSink(address)
        try:
            with self.attach(subscriber, sink, threadsafe=True):
                while self.current(subscriber, sink):
                    yield beat()
                    await asyncio.sleep(heartbeat_s)
        finally:
            sink.close()

    async def subscribe(self, subscriber: str) -> AsyncIterator[list[StreamChunk]]:
        """The subscriber's chunks as an in-process stream of batches (harnesses and tests)."""
        batches: asyncio.Queue[list[StreamChunk]] = asyncio.Queue()
        with self.attach(subscriber, batches.put_nowait):
            while True:
                yield await batches.get()
