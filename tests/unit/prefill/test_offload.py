"""A prefill worker offers prompts to decode workers with room: a backlog's next in line, and a short prompt before it
queues (``prefill_worker/offload.py``; no Ray, no engine)."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.prefill.decodes import decode_load as _decode
from tests.unit.prefill.decodes import directory
from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.admission import Offloaded, SchedBatchGate
from tetriserve.prefill_worker.offload import Offloader
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.policy import PrefillPolicySpec
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.views import ReqView


def _offloader(offload_wait_s: float, offload_max_tokens: int = 512) -> Offloader:
    pace = PrefillPace()
    pace.seconds_per_token = 0.01  # 50-token prompts: 0.5 s each
    spec = PrefillPolicySpec(chunk_size=512, offload_max_tokens=offload_max_tokens)
    return Offloader("prefill-0", SchedBatchGate(FCFS(), 1), pace, directory(), None, spec, offload_wait_s)


async def _queue(gate: SchedBatchGate, n: int) -> dict[str, asyncio.Task[None]]:
    async def wait(rid: str, arrival: float) -> None:
        async with gate.turn(ReqView(rid, 50, 100, arrival, offloadable=True)):
            await asyncio.Event().wait()  # holds the engine's one place

    tasks = {f"r{i}": asyncio.create_task(wait(f"r{i}", float(i))) for i in range(n)}
    for _ in range(10):
        await asyncio.sleep(0)
    return tasks


async def _offered(tasks: dict[str, asyncio.Task[None]]) -> dict[str, str]:
    await asyncio.sleep(0)
    out = {}
    for rid, task in tasks.items():
        if task.done() and isinstance(exc := task.exception(), Offloaded):
            out[rid] = exc.decode_id
    return out


def _broadcast(offloader: Offloader, loads: list[DecodeLoad]) -> None:
    offloader.directory.update(loads, {}, {})
    offloader.offer_prompts()  # as the worker does on each broadcast


def test_prompts_are_offered_in_line_while_the_queue_would_wait_too_long_and_a_decode_worker_has_room() -> None:
    async def scenario() -> None:
        offloader = _offloader(offload_wait_s=1.0)
        tasks = await _queue(offloader.gate, 7)  # r0 in the engine, r1-r6 queued: 3 s of prompts
        _broadcast(offloader, [_decode("decode-0", 1, running=9), _decode("decode-1", 2, running=1),
                               _decode("decode-2", 0)])
        # the most room first; the room taken is counted until the next broadcast; then none is left
        assert await _offered(tasks) == {"r1": "decode-1", "r2": "decode-1", "r3": "decode-0"}
        loads = offloader.directory.loads
        assert loads["decode-1"].prompt_room == 0 and loads["decode-1"].queued == 2
        _broadcast(offloader, [_decode("decode-0", 2)])  # room again: r4 goes; r5, r6 (1 s) stay
        assert await _offered(tasks) == {"r1": "decode-1", "r2": "decode-1", "r3": "decode-0", "r4": "decode-0"}
        assert offloader.gate.queued == 2
        for task in tasks.values():
            task.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize("offload_wait_s", [0.0, 10.0])
def test_nothing_is_offered_when_offloading_is_off_or_the_queue_is_short_enough(offload_wait_s: float) -> None:
    async def scenario() -> None:
        offloader = _offloader(offload_wait_s)
        tasks = await _queue(offloader.gate, 6)
        _broadcast(offloader, [_decode("decode-0", 4)])
        assert await _offered(tasks) == {} and offloader.gate.queued == 5
        for task in tasks.values():
            task.cancel()

    asyncio.run(scenario())


def test_the_queue_is_noted_backlogged_while_its_engine_time_is_over_the_offload_threshold() -> None:
    """What the local share (``pace.left_queue``) is counted under: prompts that leave while decode workers may
    take them. Judged on the engine's time, not on the wait the share scales: a share of 0 still notes one."""
    offloader = _offloader(offload_wait_s=1.0)
    assert offloader.prefill_s([50] * 3) == pytest.approx(1.5) and offloader.backlogged
    assert offloader.prefill_s([50]) == pytest.approx(0.5) and not offloader.backlogged
    for _ in range(10):
        offloader.pace.left_queue(1000, offloaded=True)
    assert offloader.pace.queue_wait_s([50] * 3, None, None) < 1.0
    assert offloader.prefill_s([50] * 3) == pytest.approx(1.5) and offloader.backlogged
    offloader.wait_s = 0.0  # offloading off: never backlogged
    assert offloader.prefill_s([50] * 30) == pytest.approx(15.0) and not offloader.backlogged


def _short(offload_max_tokens: int) -> Offloader:
    offloader = _offloader(offload_wait_s=1.0, offload_max_tokens=offload_max_tokens)
    loads = [_decode("decode-0", 1, running=9), _decode("decode-1", 2, running=1), _decode("decode-2", 0)]
    offloader.directory.update(loads, {}, {})
    return offloader


def _offer(offloader: Offloader, prompt_len: int, offloadable: bool = True) -> str | None:
    return offloader.offer_short(ReqView("r", prompt_len, 100, 0.0, offloadable=offloadable))


def test_a_short_prompt_is_offered_before_it_queues_to_the_decode_worker_with_the_most_room() -> None:
    """``prefill.offload_max_tokens``: no backlog needed, the room taken is counted until the next broadcast."""
    offloader = _short(offload_max_tokens=64)
    assert [_offer(offloader, 64), _offer(offloader, 1), _offer(offloader, 30), _offer(offloader, 30)] == [
        "decode-1",
        "decode-1",
        "decode-0",
        None,  # no room left anywhere: it queues here
    ]
    loads = offloader.directory.loads
    assert all(ld.prompt_room == 0 for ld in loads.values())
    assert loads["decode-1"].queued == 2 and offloader.gate.queued == 0


def test_a_changed_policy_s_short_prompt_limit_applies_to_the_next_offer() -> None:
    offloader = _short(offload_max_tokens=64)
    offloader.set_spec(PrefillPolicySpec(chunk_size=512, offload_max_tokens=0))
    assert _offer(offloader, 1) is None


@pytest.mark.parametrize(("limit", "prompt_len", "offloadable"), [(64, 65, True), (0, 1, True), (64, 8, False)])
def test_a_prompt_stays_when_it_is_too_long_short_offers_are_off_or_it_may_not_leave(
    limit: int, prompt_len: int, offloadable: bool
) -> None:
    """Not offloadable: a prefill-only request (``max_tokens`` 1) or a seeded one (reproducible on its engine)."""
    offloader = _short(limit)
    assert _offer(offloader, prompt_len, offloadable) is None
    assert offloader.directory.loads["decode-1"].prompt_room == 2
