"""GlobalScheduler (TetriInfer §3.2): request status table, prefill placement, output relay.

    generate(req) ─▶ least-loaded prefill worker ─▶ its stream: first token ──▶ caller
                                                       Handoff(decode worker)
                     decode worker.stream(req) ──────────── tokens ──────────▶ caller

Least load = this scheduler's own count of requests it has in prefill on the
worker (exact, immediate) plus the worker's last reported queued prompt tokens
(broadcast by the ClusterMonitor) as the tie-breaker. The table records every
state change as a timestamped event on the ``Request``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from common.load import PrefillLoad
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
    output_tokens: int = 0
    aborted: bool = False


class GlobalScheduler:
    def __init__(self, prefill: dict[str, Any], decode: dict[str, Any], history: int = 1000) -> None:
        self.prefill = prefill
        self.decode = decode
        self.table: dict[str, _Entry] = {}
        self.finished: deque[Request] = deque(maxlen=history)
        self.prefill_loads: dict[str, PrefillLoad] = {}
        self.counts = {"admitted": 0, "finished": 0, "aborted": 0, "errors": 0}

    def update_prefill_loads(self, loads: list[PrefillLoad]) -> None:
        self.prefill_loads = {ld.worker_id: ld for ld in loads}

    def _pick_prefill(self) -> str:
        in_prefill: dict[str, int] = {wid: 0 for wid in self.prefill}
        for e in self.table.values():
            if e.request.state <= RequestState.PREFILLING and e.request.prefill_worker in in_prefill:
                in_prefill[e.request.prefill_worker] += 1

        def score(wid: str) -> tuple[int, float, str]:
            ld = self.prefill_loads.get(wid)
            return in_prefill[wid], ld.queued_prompt_tokens if ld else 0.0, wid

        return min(self.prefill, key=score)

    async def generate(self, req: Request) -> AsyncIterator[StreamChunk]:
        if req.request_id in self.table:
            yield StreamChunk(req.request_id, (), "error", f"request id {req.request_id} is already in flight")
            return
        entry = _Entry(req)
        self.table[req.request_id] = entry
        self.counts["admitted"] += 1
        last: StreamChunk | None = None
        try:
            async for chunk in self._run(entry):
                last = chunk
                entry.output_tokens += len(chunk.token_ids)
                yield chunk
        finally:
            self._close(entry, last)

    async def _run(self, entry: _Entry) -> AsyncIterator[StreamChunk]:
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
        async for ref in self.decode[handoff.decode_worker].stream.remote(req.request_id):
            chunk: StreamChunk = await ref
            if req.state is RequestState.DECODE_QUEUED:
                req.advance(RequestState.DECODING)
            yield chunk
            if chunk.finish_reason is not None:
                return

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
