"""Tests for the SchedBatch gate (TetriInfer §3.3.1): raw queue to scheduled queue, B requests at a time.

Each test runs on a private event loop (``asyncio.run``) and waits for state by
polling with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress

import pytest

from tetriserve.prefill_worker.admission import Offloaded, RequestAborted, SchedBatchGate
from tetriserve.prefill_worker.queue import make_queue_policy
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.queue.length_order import SJF
from tetriserve.prefill_worker.views import ReqView


def _view(rid: str, arrival: float, prompt_len: int = 100) -> ReqView:
    return ReqView(rid, prompt_len, 100, arrival)


async def until(pred: Callable[[], bool], what: str, timeout: float = 2.0) -> None:
    """Yield to the loop until ``pred()`` holds, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0)


class Harness:
    """Runs requests through a gate; each holds its turn until released, recording entry order."""

    def __init__(self, gate: SchedBatchGate) -> None:
        self.gate = gate
        self.inside: set[str] = set()
        self.entered: list[str] = []
        self.max_inside = 0
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, rid: str, arrival: float, prompt_len: int = 10) -> asyncio.Task[None]:
        self.release[rid] = asyncio.Event()
        task = asyncio.create_task(self._run(_view(rid, arrival, prompt_len)))
        self.tasks[rid] = task
        return task

    async def _run(self, v: ReqView) -> None:
        async with self.gate.turn(v):
            self.inside.add(v.request_id)
            self.entered.append(v.request_id)
            self.max_inside = max(self.max_inside, len(self.inside))
            await self.release[v.request_id].wait()
            self.inside.remove(v.request_id)

    async def settle(self) -> None:
        """Let every runnable task reach its next wait."""
        for _ in range(20):
            await asyncio.sleep(0)

    async def finish(self, rid: str) -> None:
        self.release[rid].set()
        await self.tasks[rid]


def run_async(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), timeout=10.0))  # type: ignore[arg-type]


def test_gate_rejects_bad_sched_batch() -> None:
    with pytest.raises(ValueError, match="sched_batch"):
        SchedBatchGate(FCFS(), 0)
    with pytest.raises(ValueError, match="unknown policy"):
        make_queue_policy("lifo")


def test_gate_admits_at_most_sched_batch_at_once() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 2))
        for i in range(5):
            h.start(f"r{i}", arrival=float(i), prompt_len=10 + i)
        await until(lambda: len(h.inside) == 2, "two requests inside")
        await h.settle()
        assert h.inside == {"r0", "r1"}
        assert h.gate.queued == 3 and h.gate.queued_tokens == 12 + 13 + 14
        for rid in ["r0", "r1", "r2", "r3", "r4"]:
            await until(lambda rid=rid: rid in h.inside, f"{rid} inside")  # type: ignore[misc]
            await h.settle()
            assert len(h.inside) <= 2
            await h.finish(rid)
        assert h.entered == ["r0", "r1", "r2", "r3", "r4"]
        assert h.max_inside == 2
        assert h.gate.queued == 0 and h.gate.queued_tokens == 0

    run_async(scenario)


def test_gate_next_batch_waits_until_the_current_one_is_released() -> None:
    """A late arrival that sorts first cannot overtake members of an already formed batch (starvation bound)."""

    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 2))
        for rid, arrival in [("r1", 1.0), ("r2", 2.0), ("r3", 3.0), ("r4", 4.0), ("r5", 5.0)]:
            h.start(rid, arrival)
            await h.settle()
        assert h.inside == {"r1", "r2"}
        await h.finish("r1")  # a slot frees: the batch [r3, r4] is formed and r3 enters
        await until(lambda: "r3" in h.inside, "r3 inside")
        h.start("r0", arrival=0.0)  # arrives late but sorts before everyone
        await h.settle()
        assert h.inside == {"r2", "r3"}
        await h.finish("r2")  # r4 belongs to the formed batch: it goes before r0
        await until(lambda: "r4" in h.inside, "r4 inside")
        await h.settle()
        assert h.inside == {"r3", "r4"}
        await h.finish("r3")  # the batch is used up: the next one [r0, r5] is ordered by arrival
        await until(lambda: "r0" in h.inside, "r0 inside")
        await h.finish("r4")
        await until(lambda: "r5" in h.inside, "r5 inside")
        await h.finish("r0")
        await h.finish("r5")
        assert h.entered == ["r1", "r2", "r3", "r4", "r0", "r5"]
        assert h.max_inside == 2

    run_async(scenario)


def test_gate_batch_is_ordered_by_the_policy() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 1))
        h.start("first", arrival=0.0)
        await until(lambda: "first" in h.inside, "first inside")
        for rid, arrival in [("c", 3.0), ("a", 1.0), ("b", 2.0)]:  # queued out of arrival order
            h.start(rid, arrival)
        await h.settle()
        for rid in ["first", "a", "b", "c"]:
            await until(lambda rid=rid: rid in h.inside, f"{rid} inside")  # type: ignore[misc]
            await h.finish(rid)
        assert h.entered == ["first", "a", "b", "c"]

    run_async(scenario)


def test_gate_cancel_waiting_request() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 2))
        for i in range(4):
            h.start(f"r{i}", arrival=float(i), prompt_len=100 + i)
        await h.settle()
        assert h.inside == {"r0", "r1"}
        assert h.gate.queued == 2 and h.gate.queued_tokens == 205

        assert h.gate.cancel("r2") is True
        with pytest.raises(RequestAborted, match="r2"):
            await h.tasks["r2"]
        assert h.gate.queued == 1 and h.gate.queued_tokens == 103
        assert h.gate.cancel("r2") is False  # already gone
        assert h.gate.cancel("r0") is False  # already inside the engine
        assert h.gate.cancel("nobody") is False
        assert h.inside == {"r0", "r1"}  # cancelling a waiter does not admit anyone early

        # no slot leaked: both slots keep serving the remaining request and new ones
        await h.finish("r0")
        await until(lambda: "r3" in h.inside, "r3 inside")
        h.start("r4", arrival=4.0)
        await h.settle()
        assert h.inside == {"r1", "r3"}  # both slots busy: r4 waits
        await h.finish("r1")
        await until(lambda: "r4" in h.inside, "r4 inside")
        await h.finish("r3")
        await h.finish("r4")
        assert h.entered == ["r0", "r1", "r3", "r4"]
        assert h.gate.queued == 0

    run_async(scenario)


def test_gate_cancel_member_of_a_formed_batch() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 2))
        for i in range(5):
            h.start(f"r{i}", arrival=float(i))
        await h.settle()
        await h.finish("r0")  # batch [r2, r3] formed, r2 enters, r3 waits in the batch
        await until(lambda: "r2" in h.inside, "r2 inside")
        assert h.gate.cancel("r3") is True
        with pytest.raises(RequestAborted):
            await h.tasks["r3"]
        await h.finish("r1")  # the batch is used up: r4 is next
        await until(lambda: "r4" in h.inside, "r4 inside")
        await h.finish("r2")
        await h.finish("r4")
        assert h.entered == ["r0", "r1", "r2", "r4"]

    run_async(scenario)


def test_the_next_in_line_is_the_formed_batchs_head_else_the_policys_first_of_the_next_arrivals() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(SJF(), 2))
        h.start("r0", arrival=0.0)
        h.start("r1", arrival=1.0)
        await h.settle()  # both inside
        assert h.gate.next_in_line() is None
        h.start("long", arrival=2.0, prompt_len=900)
        h.start("short", arrival=3.0, prompt_len=20)
        h.start("later", arrival=4.0, prompt_len=5)
        await h.settle()
        head = h.gate.next_in_line()  # no batch formed yet: SJF over the next two arrivals, not over all three
        assert head is not None and head.request_id == "short"
        assert h.gate.cancel("short", Offloaded("decode-1")) is True  # offered to a decode worker
        with pytest.raises(Offloaded) as offered:
            await h.tasks["short"]
        assert offered.value.decode_id == "decode-1"
        await h.finish("r0")  # batch [long, later] formed, sorted: later enters, long heads what is left
        await until(lambda: "later" in h.inside, "later inside")
        head = h.gate.next_in_line()
        assert head is not None and head.request_id == "long"
        await h.finish("r1")
        await h.finish("later")
        await h.finish("long")

    run_async(scenario)


def test_gate_task_cancelled_while_waiting_frees_nothing_it_did_not_hold() -> None:
    async def scenario() -> None:
        h = Harness(SchedBatchGate(FCFS(), 1))
        h.start("r0", arrival=0.0)
        h.start("r1", arrival=1.0)
        h.start("r2", arrival=2.0)
        await h.settle()
        h.tasks["r1"].cancel()
        with suppress(asyncio.CancelledError):
            await h.tasks["r1"]
        assert h.gate.queued == 1
        assert h.inside == {"r0"}
        await h.finish("r0")
        await until(lambda: "r2" in h.inside, "r2 inside")
        await h.finish("r2")
        assert h.entered == ["r0", "r2"]

    run_async(scenario)


def test_gate_task_cancelled_right_after_admission_does_not_leak_its_slot() -> None:
    async def scenario() -> None:
        gate = SchedBatchGate(FCFS(), 1)
        release = asyncio.Event()
        tasks: dict[str, asyncio.Task[None]] = {}

        async def holder() -> None:
            async with gate.turn(_view("a", arrival=0.0)):
                await release.wait()
            # leaving the turn handed the slot to "b", which has not run yet: cancel it now (e.g. client gone)
            tasks["b"].cancel()

        async def waiter() -> None:
            async with gate.turn(_view("b", arrival=1.0)):
                pytest.fail("b was cancelled before it could run")

        tasks["a"] = asyncio.create_task(holder())
        await until(lambda: gate.queued == 0, "a inside")
        tasks["b"] = asyncio.create_task(waiter())
        await until(lambda: gate.queued == 1, "b waiting")
        release.set()
        await tasks["a"]
        with suppress(asyncio.CancelledError):
            await tasks["b"]

        async def late() -> None:
            async with gate.turn(_view("c", arrival=2.0)):
                pass

        await asyncio.wait_for(late(), timeout=0.5)

    asyncio.run(scenario())


def test_gate_sorts_within_a_batch_of_the_earliest_arrivals_only() -> None:
    # TetriInfer §3.3.1: twenty queued, batch size ten → two sorted batches; a short late arrival cannot
    # overtake the long prompts of the batch before it (the starvation bound), but a burst is sorted together
    async def scenario() -> None:
        h = Harness(SchedBatchGate(SJF(), 2))
        for rid, arrival, n in [("long1", 0.0, 900), ("long2", 1.0, 800), ("short3", 2.0, 5), ("short4", 3.0, 4)]:
            h.start(rid, arrival, prompt_len=n)
        await h.settle()
        assert h.entered == ["long2", "long1"]  # the first batch: the two earliest, shortest first
        for rid in ["long2", "long1"]:
            await h.finish(rid)
        await until(lambda: len(h.entered) == 4, "second batch inside")
        assert h.entered[2:] == ["short4", "short3"]
        for rid in ["short4", "short3"]:
            await h.finish(rid)

    run_async(scenario)
