"""PredictionQueue: predictions on their own thread, never holding up a handoff (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.prefill_worker.predictions import PredictionQueue, PredictorState

INSTANT = LengthEstimate(0, 7, 100, source="instant")


class _Gated:
    """A predictor whose ``predict`` blocks until the test opens the gate; it records every batch."""

    name = "gated"

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[int]] = []
        self.fail = fail

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        self.batches.append([it.prompt_len for it in batch])
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("model broke")
        return [LengthEstimate(0, it.prompt_len, 1000, source="model") for it in batch]

    def instant(self, item: PredictInput) -> LengthEstimate:
        return INSTANT

    def observe(self, prompt_len: int, output_len: int) -> None:
        return None

    def warm_up(self) -> None:
        return None


def _item(n: int) -> PredictInput:
    return PredictInput(n, 256)


async def _until(cond: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.fixture
def gated() -> _Gated:
    return _Gated()


def test_a_computed_prediction_is_used_and_counted_on_time(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated)
        gated.gate.set()
        ticket = queue.submit(_item(42))
        await _until(ticket.future.done)
        estimate, refinement = await queue.estimate(ticket)
        assert (estimate.estimate, estimate.source, refinement) == (42, "model", None)
        assert queue.stats()["on_time"] == 1 and queue.stats()["late"] == 0
        queue.close()

    asyncio.run(run())


def test_a_queued_prediction_is_withdrawn_never_computed_and_the_instant_estimate_stands_in(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated, max_items=1)
        first = queue.submit(_item(1))
        await asyncio.to_thread(gated.entered.wait, 5)  # the thread is busy with ``first``
        second = queue.submit(_item(2))
        estimate, refinement = await queue.estimate(second)
        assert estimate is INSTANT and refinement is None
        gated.gate.set()
        await _until(first.future.done)
        await asyncio.sleep(0.05)
        assert gated.batches == [[1]]  # the withdrawn one never reached the model
        assert queue.stats()["late"] == 1 and queue.pending == 0
        queue.close()

    asyncio.run(run())


def test_a_running_prediction_does_not_hold_the_handoff_and_follows_as_a_refinement(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated)
        ticket = queue.submit(_item(9))
        await asyncio.to_thread(gated.entered.wait, 5)
        estimate, refinement = await queue.estimate(ticket)  # no wait by default
        assert estimate is INSTANT and refinement is not None
        gated.gate.set()
        later = await queue.later(refinement)
        assert later is not None and later.estimate == 9
        assert queue.stats()["late"] == 1 and queue.stats()["refined"] == 1
        queue.close()

    asyncio.run(run())


def test_a_bounded_wait_gets_a_running_prediction_that_finishes_within_it(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated)
        ticket = queue.submit(_item(5))
        await asyncio.to_thread(gated.entered.wait, 5)
        asyncio.get_running_loop().call_later(0.05, gated.gate.set)
        estimate, refinement = await queue.estimate(ticket, wait_s=5.0)
        assert estimate.estimate == 5 and refinement is None
        queue.close()

    asyncio.run(run())


def test_a_failing_predictor_fails_no_request() -> None:
    broken = _Gated(fail=True)
    broken.gate.set()

    async def run() -> None:
        queue = PredictionQueue(broken)
        ticket = queue.submit(_item(3))
        await _until(ticket.future.done)
        estimate, refinement = await queue.estimate(ticket)
        assert estimate is INSTANT and refinement is None
        queue.close()

    asyncio.run(run())


def test_batches_are_capped_by_prompts_and_tokens_but_a_long_prompt_still_goes(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated, max_items=3, max_tokens=100)
        blocker = queue.submit(_item(1))
        await asyncio.to_thread(gated.entered.wait, 5)
        tickets = [queue.submit(_item(n)) for n in (500, 10, 20, 30, 40, 50)]
        gated.gate.set()
        await _until(lambda: all(t.future.done() for t in (blocker, *tickets)))
        assert gated.batches == [[1], [500], [10, 20, 30], [40, 50]]
        queue.close()

    asyncio.run(run())


def test_a_request_that_goes_away_withdraws_its_ticket(gated: _Gated) -> None:
    async def run() -> None:
        queue = PredictionQueue(gated, max_items=1)
        queue.submit(_item(1))
        await asyncio.to_thread(gated.entered.wait, 5)
        gone = queue.submit(_item(2))
        queue.withdraw(gone)
        assert gone.future.cancelled() and queue.pending == 0
        gated.gate.set()
        queue.close()

    asyncio.run(run())


class _Loading(_Gated):
    """A predictor whose ``warm_up`` (loading its model) blocks until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()
        self.warm_ups = 0

    def warm_up(self) -> None:
        self.warm_ups += 1
        assert self.loaded.wait(10)


def test_the_predictor_loads_on_the_queues_thread_and_handoffs_take_the_instant_estimate_meanwhile() -> None:
    """The worker starts (and serves) while the model loads: nothing waits for the load."""
    loading = _Loading()
    loading.gate.set()

    async def run() -> None:
        queue = PredictionQueue(loading)
        ticket = queue.submit(_item(5))
        estimate, refinement = await queue.estimate(ticket)  # at once, though the model is not loaded
        assert estimate is INSTANT and refinement is None and loading.batches == []
        assert queue.state is PredictorState.LOADING
        loading.loaded.set()
        after = queue.submit(_item(6))
        await _until(after.future.done)
        estimate, _ = await queue.estimate(after)
        assert (estimate.estimate, estimate.source) == (6, "model")
        assert loading.warm_ups == 1 and queue.state is PredictorState.READY
        queue.close()

    asyncio.run(run())


class _FailsToLoad(_Gated):
    def warm_up(self) -> None:
        raise OSError("no model here")


def test_a_predictor_that_fails_to_load_shows_failed_until_a_batch_is_predicted() -> None:
    failing = _FailsToLoad()
    failing.gate.set()

    async def run() -> None:
        queue = PredictionQueue(failing)
        await _until(lambda: queue.state is not PredictorState.LOADING)
        assert queue.state is PredictorState.FAILED
        ticket = queue.submit(_item(7))
        await _until(ticket.future.done)
        assert queue.state is PredictorState.READY  # it predicted after all: the first batch loaded it
        queue.close()

    asyncio.run(run())
