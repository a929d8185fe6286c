"""``OneCallOut`` (control_plane/batched_calls.py): one call out at most; the items that come meanwhile go together
in the next, each ``ask`` getting its own answer (or the call's failure), each ``tell`` nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tetriserve.common.stream import Placement, PlacementRequest
from tetriserve.control_plane.batched_calls import OneCallOut


class _Actor:
    """A remote method whose ``remote`` returns a future the test answers; the calls are kept in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], asyncio.Future[Any]]] = []

    def remote(self, items: list[Any]) -> asyncio.Future[Any]:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.append((list(items), answer))
        return answer

    def place(self, call: int) -> None:
        metas, answer = self.calls[call]
        answer.set_result([Placement(m.request_id, f"prefill-of-{m.request_id}") for m in metas])


def _meta(rid: str) -> PlacementRequest:
    return PlacementRequest(rid, 10, 8, 0.0)


def _ids(actor: _Actor) -> list[list[str]]:
    return [[m.request_id for m in metas] for metas, _ in actor.calls]


def test_one_call_out_and_the_rest_batched_in_order() -> None:
    async def run() -> None:
        gs = _Actor()
        placements: OneCallOut[PlacementRequest, Placement] = OneCallOut(lambda: gs, timeout_s=5.0)
        first = asyncio.ensure_future(placements.ask(_meta("a")))
        await asyncio.sleep(0)
        assert _ids(gs) == [["a"]]  # alone, at once
        rest = [asyncio.ensure_future(placements.ask(_meta(rid))) for rid in "bcd"]
        await asyncio.sleep(0)
        assert len(gs.calls) == 1  # they wait for the call that is out
        gs.place(0)
        assert (await first).prefill_worker == "prefill-of-a"
        await asyncio.sleep(0)
        assert _ids(gs) == [["a"], ["b", "c", "d"]]
        gs.place(1)
        assert [(await r).prefill_worker for r in rest] == ["prefill-of-b", "prefill-of-c", "prefill-of-d"]
        assert len(gs.calls) == 2

    asyncio.run(run())


def test_a_failed_call_fails_each_of_its_items_and_the_next_goes_on() -> None:
    async def run() -> None:
        gs = _Actor()
        placements: OneCallOut[PlacementRequest, Placement] = OneCallOut(lambda: gs, timeout_s=5.0)
        a = asyncio.ensure_future(placements.ask(_meta("a")))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(placements.ask(_meta("b")))
        await asyncio.sleep(0)
        gs.calls[0][1].set_exception(ConnectionError("the scheduler is down"))
        with pytest.raises(ConnectionError):
            await a
        await asyncio.sleep(0)
        gs.place(1)
        assert (await b).prefill_worker == "prefill-of-b"

    asyncio.run(run())


def test_no_handle_fails_the_call_not_the_loop() -> None:
    async def run() -> None:
        def gone() -> Any:
            raise RuntimeError("being re-created")

        placements: OneCallOut[PlacementRequest, Placement] = OneCallOut(gone, timeout_s=5.0)
        with pytest.raises(RuntimeError):
            await placements.ask(_meta("a"))
        gs = _Actor()
        placements.method = lambda: gs
        later = asyncio.ensure_future(placements.ask(_meta("b")))
        await asyncio.sleep(0)
        gs.place(0)
        assert (await later).prefill_worker == "prefill-of-b"

    asyncio.run(run())


def test_tell_batches_without_answers_and_a_lost_call_loses_only_its_items() -> None:
    async def run() -> None:
        actor = _Actor()
        events: OneCallOut[int, None] = OneCallOut(lambda: actor, timeout_s=5.0)
        events.tell(1)
        events.tell(2)
        events.tell(3)
        await asyncio.sleep(0)
        assert [items for items, _ in actor.calls] == [[1]]
        actor.calls[0][1].set_exception(ConnectionError("the actor died"))  # logged, not raised
        for _ in range(3):
            await asyncio.sleep(0)
        assert [items for items, _ in actor.calls] == [[1], [2, 3]]
        actor.calls[1][1].set_result(None)
        await asyncio.sleep(0)
        assert len(actor.calls) == 2

    asyncio.run(run())


def test_a_new_event_loop_starts_afresh_and_tell_outside_one_drops() -> None:
    actor = _Actor()
    events: OneCallOut[int, None] = OneCallOut(lambda: actor, timeout_s=5.0)

    async def first() -> None:
        events.tell(1)
        await asyncio.sleep(0)
        events.tell(2)  # waits behind the call that is never answered on this loop

    asyncio.run(first())
    events.tell(3)  # no running loop: dropped

    async def second() -> None:
        events.tell(4)
        await asyncio.sleep(0)

    asyncio.run(second())
    assert [items for items, _ in actor.calls] == [[1], [4]]
