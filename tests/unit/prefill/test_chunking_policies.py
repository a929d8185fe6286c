"""Chunking: TetriInfer §3.3.3 Fig. 7 layouts, AccelGen §4.2 token budget and ERA, §4.4 Alg. 2."""

from __future__ import annotations

import pytest

from tests.prefill_support import layouts, linear_cost, req, state
from tetriserve.prefill_worker.chunking import CHUNKING_NAMES, make_chunking_policy
from tetriserve.prefill_worker.chunking.base import fill_in_order, kv_fit, kv_tokens
from tetriserve.prefill_worker.chunking.dynamic import DynamicChunking
from tetriserve.prefill_worker.chunking.fixed import FixedChunking
from tetriserve.prefill_worker.chunking.unchunked import Unchunked
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.queue.length_order import LJF, SJF

# Fig. 7's setting: three scheduled prompts of 5, 2 and 3 tokens (arrival order R1, R2, R3), ChunkSize 4
FIG7 = [req("R1", 5, 0.0), req("R2", 2, 1.0), req("R3", 3, 2.0)]


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        (FCFS(), [[("R1", 4)], [("R1", 1), ("R2", 2), ("R3", 1)], [("R3", 2)]]),
        (SJF(), [[("R2", 2), ("R3", 2)], [("R3", 1), ("R1", 3)], [("R1", 2)]]),
        (LJF(), [[("R1", 4)], [("R1", 1), ("R3", 3)], [("R2", 2)]]),
    ],
    ids=["fcfs", "sjf", "ljf"],
)
def test_fig7_slice_and_merge_layouts(queue: object, expected: list[list[tuple[str, int]]]) -> None:
    assert layouts(queue, FixedChunking(4), FIG7) == expected  # type: ignore[arg-type]


def test_fixed_chunk_is_capped_by_the_engine_ceiling_and_the_last_chunk_may_be_partial() -> None:
    policy = FixedChunking(512)
    assert policy.token_budget(state([req("a", 10)], max_budget=256)) == 256
    chunks = policy.plan(state([req("a", 100), req("b", 30)]))
    assert [(c.request_id, c.start, c.tokens) for c in chunks] == [("a", 0, 100), ("b", 0, 30)]
    with pytest.raises(ValueError, match=r"prefill\.chunk_size"):
        FixedChunking(0)


def test_chunk_starts_where_the_prompt_left_off() -> None:
    chunks = FixedChunking(64).plan(state([req("a", 300, computed_tokens=256)]))
    assert [(c.start, c.tokens, c.end) for c in chunks] == [(256, 44, 300)]


def test_unchunked_takes_whole_prompts_and_never_splits_one() -> None:
    policy = Unchunked()
    ordered = [req("a", 300), req("b", 500), req("c", 100)]
    chunks = policy.plan(state(ordered, max_budget=1000))
    assert [(c.request_id, c.tokens) for c in chunks] == [("a", 300), ("b", 500), ("c", 100)]
    chunks = policy.plan(state(ordered, max_budget=700))  # b does not fit whole: stop there, keep order
    assert [(c.request_id, c.tokens) for c in chunks] == [("a", 300)]
    # a prompt longer than the ceiling alone still makes progress
    assert [(c.tokens) for c in policy.plan(state([req("x", 5000)], max_budget=2048))] == [2048]


# -- AccelGen §4.2 -------------------------------------------------------------------------------------------------


def test_token_budget_formula() -> None:
    # S_b = S_pf · SLO_min / T̄_pf with S_pf = 512 tokens, T̄_pf = 0.5 s
    policy = DynamicChunking(linear_cost())
    s = state([], max_budget=8192, block_size=32)
    assert policy.budget_for(0.25, s) == 256
    assert policy.budget_for(1.0, s) == 1024
    assert policy.budget_for(None, s) == 512  # no SLO: the pivot size
    assert policy.budget_for(100.0, s) == 8192  # clamped to the engine's ceiling
    assert policy.budget_for(1e-6, s) == 32  # and to at least one block


def test_token_budget_follows_online_correction() -> None:
    cost = linear_cost()
    policy = DynamicChunking(cost)
    for _ in range(60):
        cost.observe_prefill([(0, 512)], 1.024)  # iterations run twice as slow as profiled: T̄_pf → 1 s
    assert policy.budget_for(1.0, state([], max_budget=8192)) == pytest.approx(512, abs=8)


def test_502_tokens_of_a_6k_prompt_fill_the_remaining_budget() -> None:
    # AccelGen Fig. 9: green and blue requests are taken whole, then 502 tokens of the 6k prompt reach S_b
    policy = DynamicChunking(linear_cost())  # S_b = 512 · 1.0 / 0.5 = 1024 for a 1 s SLO
    ordered = [
        req("green", 300, ttft_slo_s=1.0),
        req("blue", 222, ttft_slo_s=1.0),
        req("red-6k", 6000, ttft_slo_s=1.0),
        req("after", 100, ttft_slo_s=1.0),
    ]
    s = state(ordered, max_budget=8192)
    assert policy.token_budget(s) == 1024
    assert [(c.request_id, c.tokens) for c in policy.plan(s)] == [("green", 300), ("blue", 222), ("red-6k", 502)]


def test_exclusive_request_allocation_starts_no_second_long_prompt() -> None:
    policy = DynamicChunking(linear_cost())  # long = longer than S_pf = 512 tokens
    ordered = [req("long-a", 3000, computed_tokens=1024), req("long-b", 2000), req("short", 100)]
    chunks = policy.plan(state(ordered, max_budget=8192))  # no SLOs: S_b = 512
    assert [(c.request_id, c.tokens) for c in chunks] == [("long-a", 512)]
    ordered = [req("long-b", 2000), req("short", 100), req("long-a", 3000, computed_tokens=2950)]
    chunks = policy.plan(state(ordered, max_budget=8192))  # long-b waits while long-a finishes
    assert [(c.request_id, c.tokens) for c in chunks] == [("short", 100), ("long-a", 50)]
    # without one in progress, the first long prompt in order starts and the second waits
    chunks = fill_in_order([req("l1", 600), req("l2", 700), req("s", 10)], 2000, long_prompt_tokens=512)
    assert [(c.request_id, c.tokens) for c in chunks] == [("l1", 600), ("s", 10)]


def test_budget_shrinks_to_the_tightest_slo_in_the_iteration() -> None:
    # head's SLO gives 1024, but a 0.25 s request joins that iteration: the budget drops to 256
    policy = DynamicChunking(linear_cost())
    ordered = [req("loose", 200, ttft_slo_s=1.0), req("tight", 100, ttft_slo_s=0.25), req("x", 900, ttft_slo_s=1.0)]
    s = state(ordered, max_budget=8192)
    assert policy.token_budget(s) == 256
    assert [(c.request_id, c.tokens) for c in policy.plan(s)] == [("loose", 200), ("tight", 56)]


def test_dynamic_needs_a_cost_model_and_unknown_names_fail_with_the_field() -> None:
    for name in CHUNKING_NAMES:
        assert make_chunking_policy(name, 64, linear_cost()).name == name
    with pytest.raises(ValueError, match=r"prefill\.chunking 'dynamic' needs a cost model"):
        make_chunking_policy("dynamic", 64)
    with pytest.raises(ValueError, match=r"prefill\.chunking: unknown policy 'adaptive'"):
        make_chunking_policy("adaptive", 64)
    with pytest.raises(ValueError, match=r"prefill\.chunk_selection"):
        DynamicChunking(linear_cost(), select="best")  # type: ignore[arg-type]


# -- AccelGen §4.4 Alg. 1/2 ---------------------------------------------------------------------------------------


def test_kv_demand_counts_whole_blocks_and_a_partly_filled_one() -> None:
    assert kv_tokens(req("a", 100), 40, 32) == 64  # 40 tokens → 2 blocks
    assert kv_tokens(req("a", 100, computed_tokens=40), 20, 32) == 0  # tokens 40..59 fit the block it holds
    assert kv_tokens(req("a", 100, computed_tokens=40), 30, 32) == 32  # 70 tokens: a third block
    assert kv_fit(req("a", 1000, computed_tokens=40), 64, 32) == 88  # its partial block's 24 slots + 2 free blocks
    assert kv_fit(req("a", 100), float("inf"), 32) == 100


def multi(budget_s: float | None = None, window: float = 0.01) -> DynamicChunking:
    return DynamicChunking(linear_cost(), select="multi-resource", group_window_s=window)


def test_alg2_picks_least_euclidean_distance_to_free_resources() -> None:
    # A_c = 512 (no SLO), A_m = 4 blocks · 32 = 128 tokens of KV
    ordered = [req("a", 200), req("b", 96), req("c", 128), req("d", 30)]
    chunks = multi().plan(state(ordered, max_budget=8192, block_size=32, free_kv_blocks=4))
    # a (D_m 224) does not fit A_m; c (128,128) leaves (384, 0) → distance 384; b (96,96) → (416, 32); c first,
    # then nothing else fits in KV
    assert [(c.request_id, c.tokens) for c in chunks] == [("c", 128)]


def test_alg2_chunks_a_long_prompt_to_what_kv_allows() -> None:
    ordered = [req("long", 5000)]
    chunks = multi().plan(state(ordered, max_budget=8192, block_size=32, free_kv_blocks=10))
    assert [(c.request_id, c.tokens) for c in chunks] == [("long", 320)]  # KV (320) shorter than S_b (512)


def test_alg1_urgent_requests_go_first_whatever_their_fit() -> None:
    cost = linear_cost()
    from tetriserve.prefill_worker.queue.accelgen import AccelGenRemainingTime

    queue = AccelGenRemainingTime(cost)
    ordered = queue.order(
        [req("urgent", 300, arrival=0.0, ttft_slo_s=0.8), req("calm", 510, arrival=0.0, ttft_slo_s=50.0)], now=0.0
    )
    s = state(
        ordered,
        max_budget=8192,
        free_kv_blocks=1000,
        remaining_time=queue.remaining_times(ordered, 0.0),
        urgent_s=cost.iteration_seconds(),
    )
    # S_b = 512·0.8/0.5 = 819. Alone, Alg. 2 would take calm first (it leaves 309 of compute, urgent 519), but
    # urgent (T_r = 0.8 − 0.5 = 0.3 ≤ T_max 0.5) goes in before selection starts
    assert [(c.request_id, c.tokens) for c in multi().plan(s)] == [("urgent", 300), ("calm", 510)]
    calm_first = state(ordered, max_budget=8192, free_kv_blocks=1000, remaining_time={}, urgent_s=0.5)
    assert [c.request_id for c in multi().plan(calm_first)] == ["calm", "urgent"]


def test_alg2_selects_group_by_group_within_the_window() -> None:
    ordered = [req("g1", 100), req("g2", 400), req("h1", 12)]
    tr = {"g1": 1.0, "g2": 1.005, "h1": 5.0}
    chunks = multi(window=0.01).plan(state(ordered, max_budget=8192, free_kv_blocks=None, remaining_time=tr))
    # S_b = 512. First group {g1, g2}: g2 leaves 112 < g1's 412 → g2, then g1; then the next group, {h1}
    assert [(c.request_id, c.tokens) for c in chunks] == [("g2", 400), ("g1", 100), ("h1", 12)]
