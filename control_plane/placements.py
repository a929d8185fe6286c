"""A front door's placements go to the GlobalScheduler many to a call (issue #12; TetriInfer §3.2's dispatch).

Each request asks the GlobalScheduler where it goes (``ray_backend.RayBackend._place``). With one Ray call per
request, each call's overhead lands on the front door's event loop, and every answer then waits its turn behind
the burst's other requests on that loop before its request can go to its prefill worker: the prefill engine sat
idle while the front door took a burst in (``benchmarks/burst_spans.py``, 200 prompts at once: no request but the
first at the prefill worker before 1 s, all by 1.5 s, in s54_burst_probe.md; all by 0.5 s with the batching, in
s54_burst_batched.md).

So a ``Placements`` keeps one call in flight at most (``GlobalScheduler.place_many``): a request that asks while
none is out goes at once, alone; those that ask while one is out go together in the next, as soon as its answer
is in. At one stream that is the single call it was; under a burst the number of calls follows the scheduler's
pace, not the requests'. The scheduler decides each in order exactly as it would one by one, so the decisions
are the same. A failed call (the scheduler restarting) fails every request in it, and each asks again as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tetriserve.common.stream import Placement, PlacementRequest


class Placements:
    """One event loop's placements, batched while a call is out; ``scheduler`` gives the current actor handle
    (the supervisor re-creates a dead one)."""

    def __init__(self, scheduler: Callable[[], Any], timeout_s: float) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()
        self._waiting: list[tuple[PlacementRequest, asyncio.Future[Placement]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.calls = 0  # calls made (a test's view of the batching)

    async def place(self, meta: PlacementRequest) -> Placement:
        """``meta``'s placement; raises what the call raised (the scheduler down, the call past ``timeout_s``)."""
        answer: asyncio.Future[Placement] = self.loop.create_future()
        self._waiting.append((meta, answer))
        if self._sender is None or self._sender.done():  # none out: this one goes now, not at the loop's next turn
            self._sender = asyncio.ensure_future(self._send(self._call()))
        return await answer

    def _call(self) -> tuple[list[tuple[PlacementRequest, asyncio.Future[Placement]]], Any]:
        batch, self._waiting = self._waiting, []
        self.calls += 1
        try:
            return batch, self.scheduler().place_many.remote([meta for meta, _ in batch])
        except Exception as exc:  # no handle to call (the scheduler is being re-created)
            return batch, exc

    async def _send(self, call: tuple[list[tuple[PlacementRequest, asyncio.Future[Placement]]], Any]) -> None:
        while True:
            batch, ref = call
            try:
                if isinstance(ref, Exception):
                    raise ref
                placements: list[Placement] = await asyncio.wait_for(ref, self.timeout_s)
            except Exception as exc:  # every request of the call asks again (``_place``'s loop)
                for _, answer in batch:
                    if not answer.done():
                        answer.set_exception(exc)
            else:
                for (_, answer), placement in zip(batch, placements, strict=True):
                    if not answer.done():
                        answer.set_result(placement)
            if not self._waiting:
                return
            call = self._call()
