"""The engine loop frees what an aborted request held, with no other request to step it along; with a stream
interval it hands over fewer, larger deltas, the same tokens; it does not pause between the chunks of a prompt.

A decode request whose KV is still in flight (vLLM's WAITING_FOR_REMOTE_KVS) holds its blocks. Aborted
then (its prefill worker died mid-handoff, or its client left), vLLM frees them only once the KV
connector reports the load over, in a later step: the loop must take that step although no request is
left, and the connector must report a load it cancels. One in-process engine (tiny model, the decode
role's scheduler and connector), driven by ``EngineLoop`` as a worker drives it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import decode_engine_args
from tetriserve.common.config import EngineConfig
from tetriserve.engine.settings import engine_env

os.environ.update(engine_env(EngineConfig(threads_per_engine=1)))  # in-process engine; before vllm is imported


@pytest.fixture(scope="module")
def loop(model_path: str) -> Iterator[Any]:
    from tetriserve.engine.loop import EngineLoop

    args = decode_engine_args(model_path, "test-engine-loop", num_blocks=40)
    engine_loop = EngineLoop(args, "test-engine-loop")
    yield engine_loop
    engine_loop.close()  # vLLM's KV connector is process-wide: the next module's engine must not find this one's


def _held(loop: Any) -> tuple[float, int]:
    """(block pool usage, requests vLLM's scheduler still holds), read on the engine thread."""
    return loop.call_now(lambda s: (s.kv_cache_manager.block_pool.get_usage(), len(s.requests)))


def _wait_for(loop: Any, done: Any, timeout_s: float) -> tuple[float, int]:
    deadline = time.monotonic() + timeout_s
    held = _held(loop)
    while not done(held) and time.monotonic() < deadline:
        time.sleep(0.05)
        held = _held(loop)
    return held


def test_a_request_aborted_while_its_kv_is_in_flight_leaves_no_block_held(loop: Any) -> None:
    from vllm import SamplingParams

    from tetriserve.transport.instructions import KV_PARAMS_KEY, KVInstruction, KVMode

    prompt = list(range(10, 110))  # 100 tokens: 4 blocks of 32
    kv = KVInstruction(KVMode.RECV, "never-sent", len(prompt) - 1)
    params = SamplingParams(max_tokens=8, temperature=0.0, extra_args={KV_PARAMS_KEY: kv.params()})
    deltas: list[Any] = []

    async def add_then_abort() -> None:
        loop.add("aborted-mid-load", prompt, params, deltas.append)
        # the engine allocates the request's blocks and waits for its KV (the connector's deadline is 30 s)
        usage, _ = await asyncio.to_thread(_wait_for, loop, lambda held: held[0] > 0, 10.0)
        assert usage > 0, "the request never took blocks to load its KV into"
        loop.abort("aborted-mid-load")
        await asyncio.sleep(0.1)  # the abort's delta comes back through this event loop

    asyncio.run(add_then_abort())
    assert [d.finish_reason for d in deltas] == ["abort"]
    usage, requests = _wait_for(loop, lambda held: held == (0.0, 0), 5.0)
    assert (usage, requests) == (0.0, 0), "an aborted request's blocks stay held until some other request comes"
    assert loop.in_flight == 0


def test_a_stream_interval_hands_over_the_same_tokens_in_fewer_deltas(loop: Any) -> None:
    from vllm import SamplingParams

    async def run(interval_s: float, rid: str) -> list[Any]:
        loop.stream_interval_s = interval_s
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        return [d async for d in loop.generate(rid, list(range(10, 60)), params)]

    try:
        every_step = asyncio.run(run(0.0, "every-step"))
        coalesced = asyncio.run(run(0.05, "coalesced"))
    finally:
        loop.stream_interval_s = 0.0
    tokens = [t for d in every_step for t in d.token_ids]
    assert len(tokens) == 40 and len(every_step) >= 40  # a delta a step
    assert [t for d in coalesced for t in d.token_ids] == tokens  # greedy: the same tokens
    assert len(coalesced) < len(every_step) / 2
    assert coalesced[-1].finish_reason == "length" and all(d.finish_reason is None for d in coalesced[:-1])


def test_a_prompt_computed_over_several_steps_is_not_paused_between_them(loop: Any, monkeypatch: Any) -> None:
    """The loop pauses 1 ms after a step that produced nothing, so that an engine with only KV in flight does
    not spin; a step that computed a chunk of a prompt also produces nothing, and must be followed at once."""
    import threading

    from vllm import SamplingParams

    paused_after: list[int] = []  # the steps the engine thread paused after
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is loop._thread:
            paused_after.append(loop.steps)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    budget = loop.call_now(lambda s: s.max_num_scheduled_tokens)
    loop.call_now(lambda s: setattr(s, "max_num_scheduled_tokens", 32))  # a 100-token prompt takes 4 steps
    try:
        steps = loop.steps
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        deltas = asyncio.run(_collect(loop.generate("chunked", list(range(200, 300)), params)))
    finally:
        loop.call_now(lambda s: setattr(s, "max_num_scheduled_tokens", budget))
    assert [t for d in deltas for t in d.token_ids] and deltas[-1].finish_reason == "length"
    computing = range(steps + 1, steps + 5)  # four chunks (the fourth samples the first token), then the second
    assert loop.steps >= computing[-1] + 1
    assert not [step for step in paused_after if step in computing]  # a step vLLM took to finish up may pause


async def _collect(deltas: Any) -> list[Any]:
    return [d async for d in deltas]


def test_an_added_hook_runs_on_the_engine_thread_before_the_first_delta(loop: Any) -> None:
    import threading

    from vllm import SamplingParams

    seen: list[str] = []

    async def run() -> None:
        done = asyncio.Event()

        def sink(delta: Any) -> None:
            seen.append("delta")
            if delta.finish_reason is not None:
                done.set()

        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        loop.add("hooked", list(range(10, 40)), params, sink, lambda: seen.append(threading.current_thread().name))
        await asyncio.wait_for(done.wait(), 60)

    asyncio.run(run())
    assert seen[0].startswith("engine-") and seen[1:] and set(seen[1:]) == {"delta"}


def test_the_engine_feeds_our_stats_and_no_prometheus_registry_of_its_own(loop: Any) -> None:
    """vLLM adds its own Prometheus logger unless one is given; the loop gives a stand-in that registers and records
    nothing (nobody scrapes a worker's in-process registry), and our collector still counts every step."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    prometheus = [s for s in loop.engine.logger_manager.stat_loggers if isinstance(s, PrometheusStatLogger)]
    assert len(prometheus) == 1 and not hasattr(prometheus[0], "histogram_time_to_first_token")
    steps = loop.stats().steps
    asyncio.run(_run_one(loop))
    assert _wait_for_steps(loop, steps)
    assert (Path(f"/proc/{os.getpid()}/task/{loop._thread.native_id}/comm").read_text().strip()) == "eng-test-engine"


async def _run_one(loop: Any) -> None:
    from vllm import SamplingParams

    async for _ in loop.generate("stats-1", list(range(10, 20)), SamplingParams(max_tokens=4, temperature=0.0)):
        pass


def _wait_for_steps(loop: Any, before: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while loop.stats().steps <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    return loop.stats().steps > before
