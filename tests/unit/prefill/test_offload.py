"""A prefill worker offers prompts to decode workers with room: a backlog's next in line, and a short prompt before it
queues (no Ray, no engine)."""

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
    worker._decode_peers = {"decode-0": object(), "decode-1": object(), "decode-2": object()}
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


def _short_worker(offload_max_tokens: int) -> PrefillWorker:
    worker = _worker(offload_wait_s=1.0)
    worker.config = ClusterConfig(prefill={"offload_wait_s": 1.0}, transport={"pipeline": False})
    spec = SimpleNamespace(chunk_size=512, offload_max_tokens=offload_max_tokens)
    worker.policy = SimpleNamespace(spec=spec)
    loads = [_decode("decode-0", 1, running=9), _decode("decode-1", 2, running=1), _decode("decode-2", 0)]
    worker.decode_loads = {ld.worker_id: ld for ld in loads}
    return worker


def _offer(worker: PrefillWorker, prompt_len: int, offloadable: bool = True) -> str | None:
    return worker.offer_short(ReqView("r", prompt_len, 100, 0.0, offloadable=offloadable))


def test_a_short_prompt_is_offered_before_it_queues_to_the_decode_worker_with_the_most_room() -> None:
    """``prefill.offload_max_tokens``: no backlog needed, the room taken is counted until the next broadcast."""
    worker = _short_worker(offload_max_tokens=64)
    assert [_offer(worker, 64), _offer(worker, 1), _offer(worker, 30), _offer(worker, 30)] == [
        "decode-1",
        "decode-1",
        "decode-0",
        None,  # no room left anywhere: it queues here
    ]
    assert all(ld.prompt_room == 0 for ld in worker.decode_loads.values())
    assert worker.decode_loads["decode-1"].queued == 2 and worker.gate.queued == 0


@pytest.mark.parametrize(("limit", "prompt_len", "offloadable"), [(64, 65, True), (0, 1, True), (64, 8, False)])
def test_a_prompt_stays_when_it_is_too_long_short_offers_are_off_or_it_may_not_leave(
    limit: int, prompt_len: int, offloadable: bool
) -> None:
    """Not offloadable: a prefill-only request (``max_tokens`` 1) or a seeded one (reproducible on its engine)."""
    worker = _short_worker(limit)
    assert _offer(worker, prompt_len, offloadable) is None
    assert worker.decode_loads["decode-1"].prompt_room == 2


def _request_path(worker: PrefillWorker, taken: bool) -> tuple[list[str], list[tuple[int, bool]], list[str]]:
    """Run one short request through ``_prefill`` with a decode worker that takes (or refuses) it: the decode
    workers it was offered to, what the pace was told, the requests that reached the engine (which holds them)."""
    from tetriserve.common.request import Request, SamplingSpec

    offers: list[str] = []
    told: list[tuple[int, bool]] = []
    computed: list[str] = []

    async def run_engine(req: Request, view: ReqView, park: bool) -> None:
        computed.append(req.request_id)
        await asyncio.Event().wait()

    async def offload(req: Request, subscriber: str, ticket: object, decode_id: str) -> bool:
        offers.append(decode_id)
        return taken

    async def scenario() -> None:
        worker._offload = offload  # type: ignore[method-assign]
        worker._run_engine = run_engine  # type: ignore[method-assign,assignment]
        worker._backlogged = True
        worker.pace.left_queue = lambda tokens, offloaded: told.append((tokens, offloaded))  # type: ignore[method-assign]
        worker.predictions = SimpleNamespace(submit=lambda item: object(), withdraw=lambda ticket: None)
        req = Request("r", tuple(range(1, 21)), SamplingSpec(max_tokens=16))
        task = asyncio.create_task(worker._prefill(req, "fd"))
        for _ in range(10):
            await asyncio.sleep(0)
        if not taken:  # refused: it waits for the prefill engine like any other prompt
            assert not task.done()
            task.cancel()
        else:
            assert task.done() and task.exception() is None

    asyncio.run(scenario())
    return offers, told, computed


def test_a_short_prompt_a_decode_worker_takes_never_queues_here_nor_counts_in_the_queue_s_share() -> None:
    worker = _short_worker(offload_max_tokens=64)
    assert _request_path(worker, taken=True) == (["decode-1"], [], [])


def test_a_short_prompt_the_decode_worker_refuses_is_prefilled_here_offered_once() -> None:
    worker = _short_worker(offload_max_tokens=64)
    assert _request_path(worker, taken=False) == (["decode-1"], [(20, False)], ["r"])
