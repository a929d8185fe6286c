"""The prefill engine's vLLM scheduler subclass follows the policy's order and token budget (real engine).

One in-process vLLM engine (tiny model) with ``TetriPrefillScheduler``; every
prompt is added before the first step, so the iteration layout is
deterministic and must equal the pure policy's, computed by the same
simulator the unit tests use.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tetriserve.common.config import EngineConfig
from tetriserve.engine.settings import engine_env

os.environ.update(engine_env(EngineConfig(threads_per_engine=1)))  # in-process engine; before vllm is imported

from tests.prefill_support import layouts, linear_cost, req
from tetriserve.common.engine_tags import EngineTags
from tetriserve.prefill_worker.policy import PrefillPolicySpec, build_prefill_policy

CEILING = 1024


@pytest.fixture(scope="module")
def engine(model_path: str) -> Iterator[Any]:
    from vllm.v1.engine.llm_engine import LLMEngine

    from tetriserve.engine.settings import EngineRole, build_engine_args

    cfg = EngineConfig(dtype="float32", max_model_len=1024, enforce_eager=True, kv_cache_gb=0.25, max_num_seqs=64)
    args = build_engine_args(
        cfg,
        model_path,
        EngineRole.COLOCATED,
        chunk_size=CEILING,
        scheduler_cls="tetriserve.prefill_worker.vllm_scheduler.TetriPrefillScheduler",
    )
    yield LLMEngine.from_engine_args(args)


def run_burst(engine: Any, lengths: dict[str, int], meta: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """Add every prompt, step until all are prefilled; returns the scheduler's iteration records."""
    from vllm import SamplingParams

    sched = engine.engine_core.engine_core.scheduler
    before = len(sched.log.records())
    rng = random.Random("".join(lengths))  # distinct prompts per test: no prefix-cache hits
    for i, (rid, n) in enumerate(lengths.items()):
        tags = EngineTags(request_id=rid, arrival=float(i), **(meta or {}).get(rid, {}))
        params = SamplingParams(max_tokens=1, temperature=0.0, extra_args=tags.extra())
        engine.add_request(rid, {"prompt_token_ids": [rng.randrange(10, 1000) for _ in range(n)]}, params)
    while engine.has_unfinished_requests():
        engine.step()
    return sched.log.records()[before:]


def layout_of(records: list[Any]) -> list[list[tuple[str, int]]]:
    return [[(rid, n) for rid, _, n in r.chunks] for r in records]


@pytest.mark.parametrize("queue", ["fcfs", "sjf", "ljf"])
def test_engine_follows_queue_order_and_fixed_chunk(engine: Any, queue: str) -> None:
    from tetriserve.prefill_worker.chunking.fixed import FixedChunking
    from tetriserve.prefill_worker.queue import make_queue_policy

    sched = engine.engine_core.engine_core.scheduler
    sched.configure(build_prefill_policy(PrefillPolicySpec(queue=queue, chunk_size=64), None))
    lengths = {f"{queue}-a": 150, f"{queue}-b": 40, f"{queue}-c": 90, f"{queue}-d": 20}
    records = run_burst(engine, lengths)
    views = [req(rid, n, arrival=float(i)) for i, (rid, n) in enumerate(lengths.items())]
    assert layout_of(records) == layouts(make_queue_policy(queue), FixedChunking(64), views)
    assert all(r.budget == 64 and r.tokens <= 64 for r in records)
    long_starts = [h for r in records for rid, h, _ in r.chunks if rid == f"{queue}-a"]
    assert long_starts == sorted(long_starts) and long_starts[0] == 0  # l_has as vLLM saw it, chunk by chunk


def test_engine_follows_dynamic_budget_and_exclusive_allocation(engine: Any) -> None:
    # S_pf 512 tokens in 0.5 s with a 0.1 s TTFT SLO → S_b = 102 tokens; long = more than 64 tokens (ERA)
    from tetriserve.prefill_worker.chunking.dynamic import DynamicChunking
    from tetriserve.prefill_worker.policy import PrefillPolicy
    from tetriserve.prefill_worker.queue.fcfs import FCFS

    cost = linear_cost()
    cost.prefill_gamma.alpha = 1e-9  # keep γ at 1: the budget must not drift with this machine's real timings
    policy = PrefillPolicy(
        PrefillPolicySpec(chunking="dynamic"), FCFS(), DynamicChunking(cost, long_prompt_tokens=64), cost
    )
    engine.engine_core.engine_core.scheduler.configure(policy)
    lengths = {"d-short": 30, "d-long1": 200, "d-long2": 150, "d-tail": 10}
    slo = {rid: {"ttft_slo_s": 0.1} for rid in lengths}
    records = run_burst(engine, lengths, slo)
    views = [req(rid, n, arrival=float(i), ttft_slo_s=0.1) for i, (rid, n) in enumerate(lengths.items())]
    expected = layouts(FCFS(), DynamicChunking(linear_cost(), long_prompt_tokens=64), views)
    assert layout_of(records) == expected
    assert expected[0] == [("d-short", 30), ("d-long1", 72)]  # long2 waits for long1 (ERA); tail fills in
    assert all(r.budget <= 102 for r in records)
    first_long2 = next(i for i, lay in enumerate(expected) if any(rid == "d-long2" for rid, _ in lay))
    last_long1 = max(i for i, lay in enumerate(expected) if any(rid == "d-long1" for rid, _ in lay))
    assert first_long2 >= last_long1


def test_iterations_are_measured_and_overhead_is_small(engine: Any) -> None:
    stats = engine.engine_core.engine_core.scheduler.log.stats()
    assert stats.iterations > 5 and stats.exec_s > 0
    assert stats.overhead_share < 0.5  # a sanity bound only; the benchmark reports the real share
