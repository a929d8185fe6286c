"""Calls to an actor method that takes a list, one out at a time: what comes meanwhile goes in the next.

A front door asks the GlobalScheduler where each request goes (TetriInfer §3.2's dispatch) and tells the control
plane each one's TTFT and TPOT (the ``slo`` flip policy's input); the GlobalScheduler tells a prefill worker each
finished request's output length (the length predictor's feedback). A front door's finish event goes at
once, alone, so the request history has it when the stream ends. One Ray call per
request and per message puts a call's overhead on the caller's event loop and on the actor each time, on the
same cores as the engines, and an answer then waits its turn behind the rest of a burst on the caller's loop:
of 200 prompts sent at once, with one placement call per request no request but the first is at the prefill
worker by 1 s and all are by 1.5 s; with placements batched, all are by 0.5 s (``python
benchmarks/diagnostics/burst_spans.py --num-prompts 200 --seed 0``; one call per request measured on 779233d).

So an ``OneCallOut`` keeps one call in flight at most: an item that comes while none is out goes at once, alone;
those that come while one is out go together in the next, as soon as it is answered. With one request at a time
that is one call per request; under a burst the number of calls follows the callee's pace, not the requests'. The
callee handles the list in order exactly as it would the items one by one. ``ask`` waits for the item's own
answer (the method returns one per item, in order); a failed call fails each item of it (the placement loop
asks again). ``tell`` waits for nothing; a failed call is logged at debug level, as for any lost
fire-and-forget call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from tetriserve.control_plane.handles import RemoteMethod

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# one call: its items (each with the future of its answer, None when told) and the ref of the call, or what
# raised when it was made
_Call = tuple[list[tuple[T, asyncio.Future[R] | None]], Awaitable[list[R] | None] | Exception]


class OneCallOut(Generic[T, R]):
    """Items for ``method()``: the remote method to call now (e.g. ``lambda: scheduler.place_many``), so a
    re-created actor's handle is read at each call; it answers a list of one answer per item, or nothing when
    every item is told. Used from one event loop at a time: items of a loop that has
    gone are dropped when another starts using it."""

    def __init__(
        self, method: Callable[[], RemoteMethod[[list[T]], list[R]] | RemoteMethod[[list[T]], None]], timeout_s: float
    ) -> None:
        self.method = method
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple[T, asyncio.Future[R] | None]] = []
        self._sender: asyncio.Task[None] | None = None

    async def ask(self, item: T) -> R:
        """``item``'s answer; raises what its call raised (the actor down, the call past ``timeout_s``)."""
        answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._add(item, answer)
        return await answer

    def tell(self, item: T) -> None:
        """Send ``item``, wanting no answer; outside a running event loop (shutdown) it is dropped."""
        try:
            self._add(item, None)
        except RuntimeError:  # no running loop
            logger.debug("no event loop to send %s on", type(item).__name__)

    def _add(self, item: T, answer: asyncio.Future[R] | None) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new loop: what the old one held went with it
            self._loop, self._waiting, self._sender = loop, [], None
        self._waiting.append((item, answer))
        if self._sender is None or self._sender.done():  # none out: this goes now, not at the loop's next turn
            self._sender = asyncio.ensure_future(self._send(self._call()))

    def _call(self) -> _Call[T, R]:
        batch, self._waiting = self._waiting, []
        try:
            return batch, self.method().remote([item for item, _ in batch])
        except Exception as exc:  # no handle to call (the actor is being re-created)
            return batch, exc

    async def _send(self, call: _Call[T, R]) -> None:
        while True:
            batch, ref = call
            try:
                if isinstance(ref, Exception):
                    raise ref
                answers = await asyncio.wait_for(ref, self.timeout_s)
            except Exception as exc:
                logger.debug("actor call failed: %s", type(exc).__name__)
                for _, answer in batch:
                    if answer is not None and not answer.done():
                        answer.set_exception(exc)
            else:
                if any(answer is not None for _, answer in batch):
                    if answers is None:  # a method that answers nothing, asked for answers
                        raise TypeError("'NoneType' object is not iterable")
                    for (_, answer), value in zip(batch, answers, strict=True):
                        if answer is not None and not answer.done():
                            answer.set_result(value)
            if not self._waiting:
                return
            call = self._call()
