"""The prefill planner (prefill_worker/planner.py) driven without an engine: hand-built views, a KV pool given
as numbers, the time passed in. Expected values are literals; the arithmetic is in the comments."""

from __future__ import annotations

from tetriserve.prefill_worker.planner import KVPool, PrefillPlan, PrefillPlanner
from tetriserve.prefill_worker.policy import PrefillPolicySpec, build_prefill_policy
from tetriserve.prefill_worker.views import Chunk, ReqView

POOL = KVPool(max_tokens=2048, block_size=16, free_blocks=1000)


def _planner(**spec: object) -> PrefillPlanner:
    return PrefillPlanner(build_prefill_policy(PrefillPolicySpec(**spec), None))  # type: ignore[arg-type]


def test_fcfs_fixed_chunks_fill_the_chunk_size_in_arrival_order() -> None:
    # ChunkSize 256: A (300 tokens, first) takes all 256; B waits for the next iteration
    planner = _planner(chunk_size=256)
    views = [ReqView("B", 100, 8, arrival_time=2.0), ReqView("A", 300, 8, arrival_time=1.0)]
    assert planner.plan(views, POOL, now=3.0) == PrefillPlan((Chunk("A", 0, 256),), 256, 256)


def test_a_chunked_prompt_goes_on_from_where_it_stopped_and_the_rest_flows_to_the_next() -> None:
    # ChunkSize 256: A has 256 of its 300 computed, so 44 left; B gets the other 256 - 44 = 212 of its 300
    planner = _planner(chunk_size=256)
    views = [ReqView("A", 300, 8, arrival_time=1.0, computed_tokens=256), ReqView("B", 300, 8, arrival_time=2.0)]
    assert planner.plan(views, POOL, now=3.0) == PrefillPlan((Chunk("A", 256, 44), Chunk("B", 0, 212)), 256, 256)


def test_the_pool_caps_the_budget() -> None:
    # ChunkSize 512 but the engine takes 128 tokens an iteration: budget min(512, 128) = 128
    planner = _planner(chunk_size=512)
    plan = planner.plan([ReqView("A", 300, 8, arrival_time=1.0)], KVPool(128, 16, 1000), now=2.0)
    assert plan == PrefillPlan((Chunk("A", 0, 128),), 128, 128)


def test_sjf_orders_by_prompt_length_within_a_sched_batch() -> None:
    # SJF, PrefillSchedBatch 16, ChunkSize 512: C (50) then B (100) then A (400): 50 + 100 + 362 = 512
    planner = _planner(queue="sjf", chunk_size=512)
    views = [ReqView("A", 400, 8, arrival_time=1.0), ReqView("B", 100, 8, arrival_time=2.0),
             ReqView("C", 50, 8, arrival_time=3.0)]  # fmt: skip
    plan = planner.plan(views, POOL, now=4.0)
    assert plan.chunks == (Chunk("C", 0, 50), Chunk("B", 0, 100), Chunk("A", 0, 362))


def test_queued_since_is_the_arrival_until_served_then_the_last_service() -> None:
    planner = _planner()
    assert planner.queued_since("A", arrival=1.0) == 1.0
    planner.observe([(0, 256)], exec_s=0.01, scheduled=["A"], now=5.0)
    assert planner.queued_since("A", arrival=1.0) == 5.0
    planner.forget(live=set())  # A finished
    assert planner.queued_since("A", arrival=1.0) == 1.0 and planner.remembered == 0


def test_without_a_cost_model_nothing_is_predicted() -> None:
    assert _planner().predicted_s([(0, 256)]) is None
