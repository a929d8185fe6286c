"""A backlogged prefill worker offers the next prompts in line to decode workers with room (no Ray, no engine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.admission import Offloaded, SchedBatchGate
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.views import ReqView
from tetriserve.prefill_worker.worker import PrefillWorker


def _decode(worker_id: str, room: int, running: int = 0) -> DecodeLoad:
    return DecodeLoad(worker_id, 100, 100, 32, running, 0, 0, 0, 0.0, prompt_room=room)


def _worker(offload_wait_s: float) -> PrefillWorker:
    worker = PrefillWorker.__new__(PrefillWorker)  # no engine: the queue, its pace and the decode view
    worker.config = ClusterConfig(prefill={"offload_wait_s": offload_wait_s})
    worker.gate = SchedBatchGate(FCFS(), 1)
    worker.pace = PrefillPace()
    worker.pace.seconds_per_token = 0.01  # 50-token prompts: 0.5 s each
    worker.cost = None
    worker.policy = SimpleNamespace(spec=SimpleNamespace(chunk_size=512))
    worker.decode_loads, worker.decode_addresses, worker._dead_decodes = {}, {}, {}
    worker._decode_handles = {"decode-0": object(), "decode-1": object(), "decode-2": object()}
    return worker


async def _queue(worker: PrefillWorker, n: int) -> dict[str, asyncio.Task[None]]:
    async def wait(rid: str, arrival: float) -> None:
        async with worker.gate.turn(ReqView(rid, 50, 100, arrival, offloadable=True)):
            await asyncio.Event().wait()  # holds the engine's one place

    tasks = {f"r{i}": asyncio.create_task(wait(f"r{i}", float(i))) for i in range(n)}
    for _ in range(10):
        await asyncio.sleep(0)
    return tasks


async def _offered(tasks: dict[str, asyncio.Task[None]]) -> dict[str, str]:
    await asyncio.sleep(0)
    out = {}
    for rid, task in tasks.items():
        if task.done() and isinstance(task.exception(), Offloaded):
            out[rid] = task.exception().decode_id  # type: ignore[union-attr]
    return out


def test_prompts_are_offered_in_line_while_the_queue_would_wait_too_long_and_a_decode_worker_has_room() -> None:
    async def scenario() -> None:
        worker = _worker(offload_wait_s=1.0)
        tasks = await _queue(worker, 7)  # r0 in the engine, r1-r6 queued: 3 s of prompts
        loads = [_decode("decode-0", 1, running=9), _decode("decode-1", 2, running=1), _decode("decode-2", 0)]
        worker.update_decode_view(loads, {}, {})  # a broadcast: offers at once
        # the most room first; the room taken is counted until the next broadcast; then none is left
        assert await _offered(tasks) == {"r1": "decode-1", "r2": "decode-1", "r3": "decode-0"}
        assert worker.decode_loads["decode-1"].prompt_room == 0 and worker.decode_loads["decode-1"].queued == 2
        worker.update_decode_view([_decode("decode-0", 2)], {}, {})  # room again: r4 goes; r5, r6 (1 s) stay
        assert await _offered(tasks) == {"r1": "decode-1", "r2": "decode-1", "r3": "decode-0", "r4": "decode-0"}
        assert worker.gate.queued == 2
        for task in tasks.values():
            task.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize("offload_wait_s", [0.0, 10.0])
def test_nothing_is_offered_when_offloading_is_off_or_the_queue_is_short_enough(offload_wait_s: float) -> None:
    async def scenario() -> None:
        worker = _worker(offload_wait_s)
        tasks = await _queue(worker, 6)
        worker.update_decode_view([_decode("decode-0", 4)], {}, {})
        assert await _offered(tasks) == {} and worker.gate.queued == 5
        for task in tasks.values():
            task.cancel()

    asyncio.run(scenario())


def test_the_queue_is_noted_backlogged_while_its_engine_time_is_over_the_offload_threshold() -> None:
    """What the local share (``pace.left_queue``) is counted under: prompts that leave while decode workers may
    take them. Judged on the engine's time, not on the wait the share scales: a share of 0 still notes one."""
    worker = _worker(offload_wait_s=1.0)
    assert worker._prefill_s([50] * 3) == pytest.approx(1.5) and worker._backlogged
    assert worker._prefill_s([50]) == pytest.approx(0.5) and not worker._backlogged
    for _ in range(10):
        worker.pace.left_queue(1000, offloaded=True)
    assert worker.pace.queue_wait_s([50] * 3, None, None) < 1.0
    assert worker._prefill_s([50] * 3) == pytest.approx(1.5) and worker._backlogged
    worker.config = ClusterConfig(prefill={"offload_wait_s": 0.0})  # offloading off: never backlogged
    assert worker._prefill_s([50] * 30) == pytest.approx(15.0) and not worker._backlogged
