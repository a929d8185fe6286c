"""GlobalScheduler (TetriInfer §3.2): request status table, prefill placement, output relay.

    front door ──submit(req, subscriber)──▶ least-loaded prefill worker ─▶ first token, Handoff(decode worker)
    decode worker j ══subscribe()══▶ batches of chunks of all its requests ─┐
                                                                           ▼ routed by request id
    front door ◀══subscribe(subscriber)══ one Outbox per front door ◀── every request's chunks

A request moved to another decode worker at a slice boundary (SCLS §7) ends its
part on the old worker with a ``moved_to`` marker; its chunks are relayed in
order across the move, and aborts go to where it is now.

Relays are multiplexed (``common.outbox``): one long-lived stream per decode
worker in, one per front door out, each message carrying every chunk that was
ready. Least load = this scheduler's own count of requests it has in prefill
on the worker (exact, immediate) with the worker's last reported queued prompt
tokens (broadcast by the ClusterMonitor) as the tie-breaker. Every state
change is a timestamped event on the ``Request``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from common.load import PrefillLoad
from common.outbox import Outbox
from common.request import Request, RequestState
from common.stream import Handoff, StreamChunk

logger = logging.getLogger(__name__)

_FINISH = {
    "stop": RequestState.FINISHED_STOPPED,
    "length": RequestState.FINISHED_LENGTH,
    "abort": RequestState.FINISHED_ABORTED,
    "error": RequestState.FINISHED_ERROR,
}


@dataclass
class _Entry:
    request: Request
    subscriber: str
    decode_chunks: asyncio.Queue[StreamChunk] = field(default_factory=asyncio.Queue)
    output_tokens: int = 0
    aborted: bool = False


class GlobalScheduler:
    def __init__(self, prefill: dict[str, Any], decode: dict[str, Any], history: int = 1000) -> None:
        self.prefill = prefill
        self.decode = decode
        self.table: dict[str, _Entry] = {}
        self.finished: deque[Request] = deque(maxlen=history)
        self.prefill_loads: dict[str, PrefillLoad] = {}
        self.counts = {"admitted": 0, "finished": 0, "aborted": 0, "errors": 0, "moved": 0}
        self._outboxes: dict[str, Outbox] = {}
        self._listeners: list[asyncio.Task[None]] = []

    # -- inputs ------------------------------------------------------------------------
    async def start(self) -> None:
        """Open one subscription per decode worker (idempotent)."""
        if not self._listeners:
            self._listeners = [asyncio.create_task(self._listen(wid, h)) for wid, h in self.decode.items()]

    async def _listen(self, worker_id: str, handle: Any) -> None:
        async for ref in handle.subscribe.remote():
            for chunk in await ref:
                entry = self.table.get(chunk.request_id)
                if entry is not None:
                    entry.decode_chunks.put_nowait(chunk)
        logger.error("subscription to %s ended", worker_id)

    def update_prefill_loads(self, loads: list[PrefillLoad]) -> None:
        self.prefill_loads = {ld.worker_id: ld for ld in loads}

    # -- front-door API -------------------------------------------------------------------
    async def subscribe(self, subscriber: str) -> Any:
        """A front door's one stream: batches of chunks of every request it submitted."""
        outbox = self._outboxes.setdefault(subscriber, Outbox())
        try:
            async for batch in outbox.batches():
                yield batch
        finally:
            self._outboxes.pop(subscriber, None)
            for entry in [e for e in self.table.values() if e.subscriber == subscriber]:
                await self.abort(entry.request.request_id)  # nobody is listening any more

    def submit(self, req: Request, subscriber: str) -> str | None:
        """Admit a request; its chunks go to ``subscriber``'s stream. Returns an error message or None."""
        if subscriber not in self._outboxes:
            self._outboxes[subscriber] = Outbox()
        if req.request_id in self.table:
            return f"request id {req.request_id} is already in flight"
        entry = _Entry(req, subscriber)
        self.table[req.request_id] = entry
        self.counts["admitted"] += 1
        asyncio.get_running_loop().create_task(self._drive(entry))
        return None

    async def abort(self, request_id: str) -> bool:
        entry = self.table.get(request_id)
        if entry is None:
            return False
        entry.aborted = True
        self._abort_workers(entry.request)
        return True

    def status(self) -> dict[str, Any]:
        return {"in_flight": len(self.table), "counts": dict(self.counts), "at": time.time()}

    def recent(self, n: int = 50) -> list[Request]:
        return list(self.finished)[-n:]

    # -- a request's life ---------------------------------------------------------------------
    async def _drive(self, entry: _Entry) -> None:
        last: StreamChunk | None = None
        try:
            await self.start()
            async for chunk in self._run(entry):
                last = chunk
                entry.output_tokens += len(chunk.token_ids)
                self._deliver(entry, chunk)
        except Exception as exc:  # a worker died mid-request: the request fails, the service goes on
            logger.exception("request %s failed", entry.request.request_id)
            last = StreamChunk(entry.request.request_id, (), "error", f"{type(exc).__name__}: {exc}")
            self._deliver(entry, last)
        finally:
            self._close(entry, last)

    def _deliver(self, entry: _Entry, chunk: StreamChunk) -> None:
        outbox = self._outboxes.get(entry.subscriber)
        if outbox is not None:
            outbox.put(chunk)

    async def _run(self, entry: _Entry) -> Any:
        req = entry.request
        req.prefill_worker = self._pick_prefill()
        req.advance(RequestState.PREFILLING, req.prefill_worker)
        handoff: Handoff | None = None
        async for ref in self.prefill[req.prefill_worker].prefill.remote(req):
            item = await ref
            if isinstance(item, Handoff):
                handoff = item
                break
            if item.finish_reason is None:
                req.advance(RequestState.TRANSFERRING)
            yield item
            if item.finish_reason is not None:
                return
        if handoff is None:
            yield StreamChunk(req.request_id, (), "error", "prefill worker ended the stream without a result")
            return
        req.decode_worker = handoff.decode_worker
        req.advance(RequestState.DECODE_QUEUED, handoff.decode_worker)
        if entry.aborted:  # the abort raced the handoff: the decode worker has not heard of it yet
            self.decode[req.decode_worker].abort.remote(req.request_id)
        async for chunk in self._decode_stream(entry):
            if req.state is RequestState.DECODE_QUEUED:
                req.advance(RequestState.DECODING)
            yield chunk
            if chunk.finish_reason is not None:
                return

    async def _decode_stream(self, entry: _Entry) -> Any:
        """The request's decode chunks in order, across slice moves (SCLS §7): chunks from a worker it has
        not moved to yet wait until the current worker's ``moved_to`` marker says so."""
        req = entry.request
        early: list[StreamChunk] = []
        ready: deque[StreamChunk] = deque()
        while True:
            chunk = ready.popleft() if ready else await entry.decode_chunks.get()
            if chunk.worker and chunk.worker != req.decode_worker:
                early.append(chunk)
            elif chunk.moved_to is not None:
                req.advance(RequestState.TRANSFERRING, f"{req.decode_worker} -> {chunk.moved_to}")
                req.decode_worker = chunk.moved_to
                req.advance(RequestState.DECODE_QUEUED, chunk.moved_to)
                self.counts["moved"] += 1
                ready.extend(c for c in early if c.worker == chunk.moved_to)
                early = [c for c in early if c.worker != chunk.moved_to]
            else:
                yield chunk

    def _pick_prefill(self) -> str:
        in_prefill: dict[str, int] = dict.fromkeys(self.prefill, 0)
        for e in self.table.values():
            if e.request.state <= RequestState.PREFILLING and e.request.prefill_worker in in_prefill:
                in_prefill[e.request.prefill_worker] += 1

        def score(wid: str) -> tuple[int, float, str]:
            ld = self.prefill_loads.get(wid)
            return in_prefill[wid], ld.queued_prompt_tokens if ld else 0.0, wid

        return min(self.prefill, key=score)

    def _close(self, entry: _Entry, last: StreamChunk | None) -> None:
        req = entry.request
        reason = last.finish_reason if last is not None and last.finish_reason else "abort"
        final = _FINISH.get(reason, RequestState.FINISHED_ERROR)
        req.finish(final, (last.error or "") if last is not None else "client went away")
        if final is RequestState.FINISHED_ABORTED:
            self.counts["aborted"] += 1
            self._abort_workers(req)
        elif final is RequestState.FINISHED_ERROR:
            self.counts["errors"] += 1
            self._abort_workers(req)
        else:
            self.counts["finished"] += 1
            if req.prefill_worker is not None:
                self.prefill[req.prefill_worker].observe.remote(len(req.prompt_token_ids), entry.output_tokens)
        self.table.pop(req.request_id, None)
        self.finished.append(req)

    def _abort_workers(self, req: Request) -> None:
        if req.prefill_worker is not None:
            self.prefill[req.prefill_worker].abort.remote(req.request_id)
        if req.decode_worker is not None:
            self.decode[req.decode_worker].abort.remote(req.request_id)
        else:
            for handle in self.decode.values():  # KV may already be on its way: let every receiver drop it
                handle.discard.remote(req.request_id)
