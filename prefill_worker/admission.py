"""Raw queue → scheduled queue, PrefillSchedBatch requests at a time (TetriInfer §3.3.1).

A *batch* is the B earliest arrivals in the raw queue, ordered by the queue
policy (arrivals are pumped once per event-loop tick, so a burst that lands
together is batched together); its members enter the engine in that order
while fewer than B of this worker's requests are in the engine. The next batch is formed only
when the current one is fully released, so a request waits at most for the
batches formed before it arrived: the starvation bound of the paper.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tetriserve.prefill_worker.queue import QueuePolicy
from tetriserve.prefill_worker.views import ReqView


class RequestAborted(Exception):
    """Raised into a waiting ``turn`` when its request is aborted before entering the engine."""


class Offloaded(Exception):
    """Raised into a waiting ``turn`` whose request is offered to decode worker ``decode_id``, to compute its
    prompt there (``prefill.offload_wait_s``); refused, it waits for its turn again, by its arrival."""

    def __init__(self, decode_id: str) -> None:
        super().__init__(decode_id)
        self.decode_id = decode_id


class SchedBatchGate:
    def __init__(self, policy: QueuePolicy, sched_batch: int) -> None:
        self._raw: dict[str, tuple[ReqView, asyncio.Future[int]]] = {}
        self._batch: deque[str] = deque()
        self._batch_seq = 0
        self._in_engine = 0
        self._pump_pending = False
        self.policy = policy
        self.sched_batch = 1
        self.set_policy(policy, sched_batch)

    @property
    def queued(self) -> int:
        return len(self._raw)

    @property
    def queued_tokens(self) -> int:
        return sum(self.queued_lens())

    def queued_lens(self) -> list[int]:
        """The prompt length of every request waiting for its turn."""
        return [v.prompt_len for v, _ in self._raw.values()]

    @asynccontextmanager
    async def turn(self, view: ReqView) -> AsyncIterator[int]:
        """Wait for this request's turn in the engine; hold it for the body of the ``async with``.

        Yields the sequence number of the batch that moved it to the scheduled queue (1, 2, ...)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._raw[view.request_id] = (view, fut)
        if not self._pump_pending:  # pump once per loop tick, so requests arriving together are sorted together
            self._pump_pending = True
            loop.call_soon(self._deferred_pump)
        try:
            seq = await fut
        except BaseException:
            self._forget(view.request_id)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._in_engine -= 1  # admitted, then cancelled before it resumed: give the slot back
                self._pump()
            raise
        try:
            yield seq
        finally:
            self._in_engine -= 1
            self._pump()

    def update(self, view: ReqView) -> None:
        """A waiting request's view changed (its length estimate is out): the next batch is ordered by it."""
        entry = self._raw.get(view.request_id)
        if entry is not None and not entry[1].done():
            self._raw[view.request_id] = (view, entry[1])

    def set_policy(self, policy: QueuePolicy, sched_batch: int) -> None:
        """Switch order and batch size; the batch already formed is released as it was ordered."""
        if sched_batch < 1:
            raise ValueError(f"prefill.sched_batch must be >= 1, got {sched_batch}")
        self.policy = policy
        self.sched_batch = sched_batch
        self._pump()

    def next_in_line(self) -> ReqView | None:
        """The waiting request that would enter the engine next: the head of the batch formed, else the first of
        the batch the next B arrivals would form."""
        for request_id in self._batch:
            entry = self._raw.get(request_id)
            if entry is not None and not entry[1].done():
                return entry[0]
        batch = self._next_batch()
        return batch[0] if batch else None

    def cancel(self, request_id: str, reason: Exception | None = None) -> bool:
        """Take a request that has not entered the engine yet out of the queue: its ``turn`` raises ``reason``
        (default ``RequestAborted``)."""
        entry = self._raw.get(request_id)
        if entry is None or entry[1].done():
            return False
        entry[1].set_exception(reason if reason is not None else RequestAborted(request_id))
        self._forget(request_id)
        self._pump()
        return True

    def _forget(self, request_id: str) -> None:
        self._raw.pop(request_id, None)
        if request_id in self._batch:
            self._batch.remove(request_id)

    def _deferred_pump(self) -> None:
        self._pump_pending = False
        self._pump()

    def _next_batch(self) -> list[ReqView]:
        """The batch the waiting requests would form now: the next B arrivals, then sorted by the policy (a
        request waits at most for the batches that arrived before it)."""
        waiting = sorted(
            (v for v, f in self._raw.values() if not f.done()), key=lambda v: (v.arrival_time, v.request_id)
        )
        return self.policy.order(waiting[: self.sched_batch], time.time()) if waiting else []

    def _pump(self) -> None:
        while self._in_engine < self.sched_batch:
            if not self._batch:
                ordered = self._next_batch()
                if not ordered:
                    return
                self._batch.extend(v.request_id for v in ordered)
                self._batch_seq += 1
            request_id = self._batch.popleft()
            entry = self._raw.pop(request_id, None)
            if entry is None or entry[1].done():
                continue
            self._in_engine += 1
            entry[1].set_result(self._batch_seq)
