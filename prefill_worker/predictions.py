"""Length predictions off the prefill worker's event loop, never holding up a handoff (TetriInfer §3.3.2).

TetriInfer's parallel mode runs the predictor while the request waits for and
goes through its prefill, so the estimate is ready when the first token is out.
That holds only while the predictor is faster than the prefill. It runs on the
same cores as the engines, and the trained one (MiniLM) costs more than a small
model's whole prefill: waiting for it lengthens the gap between the first and
second token at light load, and with many requests at once it falls far behind
the prefill and every handoff waits (the decode batch fills slowly).
So the handoff takes the best estimate there is when the first token is out:

    submit(item) ──▶ pending (FIFO) ──▶ one predictor thread, a batch at a time ──▶ the ticket's future
                                        (it first loads the predictor: ``warm_up``, off the worker's start;
                                         until it is loaded, every handoff takes ``instant``; ``state``
                                         says which: loading, ready, failed)
                                        (at most ``max_items`` prompts, ``max_tokens`` prompt tokens;
                                         the first prompt always goes; niceness: it takes what the
                                         engines leave)
    estimate(ticket, wait_s), when the first token is out:
        computed        ─▶ the prediction                                         on time
        being computed  ─▶ waits up to ``wait_s`` (default 0); if still running,
                           ``predictor.instant`` now and the prediction later      late, refined
                           (``refinement``: the prefill worker forwards it to the decode worker)
        still pending   ─▶ withdrawn, never computed ─▶ ``predictor.instant``      late

Withdrawing what is queued is what lets the predictor catch up: under overload
it sheds the predictions nobody would wait for instead of spending the engines'
cores on them. A request that goes away before its handoff withdraws its ticket.
A predictor that raises is answered by ``instant`` too; no request fails for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput
from tetriserve.engine.cores import set_thread_niceness

logger = logging.getLogger(__name__)


class PredictorState(enum.Enum):
    """Whether the predictor is loaded (the prefill worker shows it in ``status``)."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"  # its load raised; the first batch tries again, and ready once a batch is predicted


class TicketState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    WITHDRAWN = "withdrawn"


@dataclass(eq=False)
class Ticket:
    """One request's prediction: its input and the future the predictor thread resolves on ``loop``."""

    item: PredictInput
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[LengthEstimate | None]  # None: the predictor failed on it
    state: TicketState = field(default=TicketState.PENDING)


class PredictionQueue:
    def __init__(
        self, predictor: LengthPredictor, max_items: int = 32, max_tokens: int = 1024, niceness: int = 0
    ) -> None:
        if max_items < 1 or max_tokens < 1:
            raise ValueError(f"max_items and max_tokens must be >= 1, got {max_items}, {max_tokens}")
        self.predictor = predictor
        self.max_items = max_items
        self.max_tokens = max_tokens
        self.niceness = niceness
        self.on_time = 0  # handoffs that had the prediction
        self.late = 0  # handoffs that went with ``instant``
        self.refined = 0  # of those, predictions that came after and were forwarded
        self.batches = 0  # predictor calls
        self.state = PredictorState.LOADING
        self._pending: deque[Ticket] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="length-predictor", daemon=True)
        self._thread.start()

    # -- event loop side ---------------------------------------------------------------
    def submit(self, item: PredictInput) -> Ticket:
        loop = asyncio.get_running_loop()
        ticket = Ticket(item, loop, loop.create_future())
        with self._cond:
            self._pending.append(ticket)
            self._cond.notify()
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """The request no longer needs its prediction; one not yet computed never will be."""
        self._take_back(ticket)
        ticket.future.cancel()

    @staticmethod
    async def within(ticket: Ticket, wait_s: float) -> LengthEstimate | None:
        """``ticket``'s prediction if it is out within ``wait_s`` (None: not by then, failed or withdrawn); the
        ticket is left as it is."""
        future = ticket.future
        if wait_s > 0 and not future.done():
            await asyncio.wait([future], timeout=wait_s)
        return future.result() if future.done() and not future.cancelled() else None

    async def estimate(
        self, ticket: Ticket, wait_s: float = 0.0
    ) -> tuple[LengthEstimate, asyncio.Future[LengthEstimate | None] | None]:
        """The best estimate for ``ticket`` now: (estimate, refinement). ``refinement`` is None when the estimate
        is final, else the future of the prediction still being computed (``wait_s`` was not enough)."""
        refinement = None
        if not self._take_back(ticket):
            await self.within(ticket, wait_s)
            if not ticket.future.done():
                refinement = ticket.future
            elif not ticket.future.cancelled() and (estimate := ticket.future.result()) is not None:
                self.on_time += 1
                return estimate, None
        self.late += 1
        return self.predictor.instant(ticket.item), refinement

    async def later(self, refinement: asyncio.Future[LengthEstimate | None]) -> LengthEstimate | None:
        """The late prediction ``estimate`` returned the future of (None: it failed or was withdrawn)."""
        await asyncio.wait([refinement])
        estimate = None if refinement.cancelled() else refinement.result()
        if estimate is not None:
            self.refined += 1
        return estimate

    @property
    def pending(self) -> int:
        return len(self._pending)

    def stats(self) -> dict[str, int]:
        return {
            "on_time": self.on_time,
            "late": self.late,
            "refined": self.refined,
            "pending": self.pending,
            "batches": self.batches,
        }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _take_back(self, ticket: Ticket) -> bool:
        """Withdraw ``ticket`` if it is still pending; True if it was (it will never be computed)."""
        with self._cond:
            if ticket.state is TicketState.PENDING:
                self._pending.remove(ticket)
                ticket.state = TicketState.WITHDRAWN
            return ticket.state is TicketState.WITHDRAWN

    # -- the predictor thread ------------------------------------------------------------
    def _run(self) -> None:
        if self.niceness and not set_thread_niceness(self.niceness):
            logger.warning("could not set the length predictor's niceness %d", self.niceness)
        try:
            self.predictor.warm_up()  # a no-op where it is loaded already (a flip back to prefill)
            self.state = PredictorState.READY
        except Exception:
            self.state = PredictorState.FAILED
            logger.exception("the length predictor did not load; it is tried again with the first batch")
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = self._take()
            results: list[LengthEstimate | None] = [None] * len(batch)
            try:
                self.batches += 1
                estimates = self.predictor.predict([t.item for t in batch])
                if len(estimates) != len(batch):
                    raise RuntimeError(f"predictor returned {len(estimates)} estimates for {len(batch)} prompts")
                results = list(estimates)
                self.state = PredictorState.READY
            except Exception:
                logger.exception("length prediction failed on %d prompts; the instant estimate stands in", len(batch))
            with self._cond:
                for t in batch:
                    t.state = TicketState.DONE
            for t, result in zip(batch, results, strict=True):
                with contextlib.suppress(RuntimeError):  # that event loop has closed: nobody waits for it
                    t.loop.call_soon_threadsafe(_settle, t.future, result)

    def _take(self) -> list[Ticket]:
        batch = [self._pending.popleft()]
        tokens = batch[0].item.prompt_len
        while (
            self._pending
            and len(batch) < self.max_items
            and tokens + self._pending[0].item.prompt_len <= self.max_tokens
        ):
            tokens += self._pending[0].item.prompt_len
            batch.append(self._pending.popleft())
        for t in batch:
            t.state = TicketState.RUNNING
        return batch


def _settle(future: asyncio.Future[LengthEstimate | None], result: LengthEstimate | None) -> None:
    if not future.done():  # else withdrawn
        future.set_result(result)
