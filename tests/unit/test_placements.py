"""``Placements`` (control_plane/placements.py): one call to the GlobalScheduler out at most; the requests that ask
meanwhile go together in the next, each getting its own answer (or the call's failure)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tetriserve.common.stream import Placement, PlacementRequest
from tetriserve.control_plane.placements import Placements


class _Scheduler:
    """``place_many.remote`` returns a future the test answers; the calls are kept in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], asyncio.Future[list[Placement]]]] = []
        self.place_many = self

    def remote(self, metas: list[PlacementRequest]) -> asyncio.Future[list[Placement]]:
        answer: asyncio.Future[list[Placement]] = asyncio.get_running_loop().create_future()
        self.calls.append(([m.request_id for m in metas], answer))
        return answer

    def answer(self, call: int) -> None:
        ids, answer = self.calls[call]
        answer.set_result([Placement(rid, f"prefill-of-{rid}") for rid in ids])


def _meta(rid: str) -> PlacementRequest:
    return PlacementRequest(rid, 10, 8, 0.0)


def test_one_call_out_and_the_rest_batched_in_order() -> None:
    async def run() -> None:
        gs = _Scheduler()
        placements = Placements(lambda: gs, timeout_s=5.0)
        first = asyncio.ensure_future(placements.place(_meta("a")))
        await asyncio.sleep(0)
        assert [ids for ids, _ in gs.calls] == [["a"]]  # alone, at once
        rest = [asyncio.ensure_future(placements.place(_meta(rid))) for rid in "bcd"]
        await asyncio.sleep(0)
        assert len(gs.calls) == 1  # they wait for the call that is out
        gs.answer(0)
        assert (await first).prefill_worker == "prefill-of-a"
        await asyncio.sleep(0)
        assert [ids for ids, _ in gs.calls] == [["a"], ["b", "c", "d"]]
        gs.answer(1)
        assert [(await r).prefill_worker for r in rest] == ["prefill-of-b", "prefill-of-c", "prefill-of-d"]
        assert placements.calls == 2

    asyncio.run(run())


def test_a_failed_call_fails_each_of_its_requests_and_the_next_goes_on() -> None:
    async def run() -> None:
        gs = _Scheduler()
        placements = Placements(lambda: gs, timeout_s=5.0)
        a = asyncio.ensure_future(placements.place(_meta("a")))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(placements.place(_meta("b")))
        await asyncio.sleep(0)
        gs.calls[0][1].set_exception(ConnectionError("the scheduler is down"))
        with pytest.raises(ConnectionError):
            await a
        await asyncio.sleep(0)
        gs.answer(1)
        assert (await b).prefill_worker == "prefill-of-b"

    asyncio.run(run())


def test_no_scheduler_handle_fails_the_call_not_the_loop() -> None:
    async def run() -> None:
        def gone() -> Any:
            raise RuntimeError("being re-created")

        placements = Placements(gone, timeout_s=5.0)
        with pytest.raises(RuntimeError):
            await placements.place(_meta("a"))
        gs = _Scheduler()
        placements.scheduler = lambda: gs
        later = asyncio.ensure_future(placements.place(_meta("b")))
        await asyncio.sleep(0)
        gs.answer(0)
        assert (await later).prefill_worker == "prefill-of-b"

    asyncio.run(run())
