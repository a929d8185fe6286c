"""AccelGen on the prefill side: Alg. 1's preemption, Alg. 2's groups within γ (in iterations of T_max), S_g
read from the length estimate on the gate's and the engine's views, and the decisions counted under accelgen.

Hand-built views and a linear cost (S_pf = 512 tokens, T̄_pf = T_max = 0.5 s); expected values are literals,
the arithmetic in the comments."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.prefill_support import linear_cost, req, state
from tetriserve.common.config import ClusterConfig
from tetriserve.common.engine_tags import EngineTags
from tetriserve.common.length import LengthEstimate
from tetriserve.prefill_worker.admission import SchedBatchGate
from tetriserve.prefill_worker.chunking.dynamic import DynamicChunking
from tetriserve.prefill_worker.chunking.multi_resource import select
from tetriserve.prefill_worker.planner import KVPool, PrefillPlanner
from tetriserve.prefill_worker.policy import AccelGenParams, PrefillPolicySpec, build_prefill_policy
from tetriserve.prefill_worker.queue.accelgen import AccelGenRemainingTime
from tetriserve.prefill_worker.views import ReqView
from tetriserve.prefill_worker.vllm_scheduler import PromptPlanning

T_MAX = 0.5  # linear_cost(): a 512-token iteration takes 0.5 s
MULTI = PrefillPolicySpec(queue="accelgen", chunking="dynamic", selection="multi-resource")


def _chunks(selected: Any) -> list[tuple[str, int]]:
    return [(c.request_id, c.tokens) for c in selected.chunks]


# -- Alg. 1 lines 2–4: preempt the batch member with the largest T_r ----------------------------------------------


def test_alg1_preempts_the_batch_member_with_the_largest_remaining_time_for_an_urgent_request() -> None:
    # free KV 2 blocks of 32 = 64 tokens; urgent u (T_r 0.1 ≤ T_max 0.5) wants 96 tokens = 3 blocks = 96 > 64.
    # Holders: p (64 computed → 2 blocks, T_r 4.0) and q (32 computed → 1 block, T_r 9.0): q has the largest
    # T_r, so q goes: A_m = 64 + 32 = 96 ≥ 96, and u takes its 96 tokens. A_m is then 0: nothing else is taken.
    ordered = [req("u", 96), req("p", 200, computed_tokens=64), req("q", 100, computed_tokens=32)]
    tr = {"u": 0.1, "p": 4.0, "q": 9.0}
    s = state(ordered, max_budget=8192, block_size=32, free_kv_blocks=2, remaining_time=tr, urgent_s=T_MAX)
    selected = select(s, 512, None, 0.01)
    assert _chunks(selected) == [("u", 96)]
    assert selected.preempted == ("q",)


def test_alg1_preempts_until_the_urgent_request_fits() -> None:
    # free KV 0; u wants 96 tokens (3 blocks). q (1 block, T_r 9.0) first: A_m 32 < 96; then p (2 blocks, T_r
    # 4.0): A_m = 32 + 64 = 96, u fits
    ordered = [req("u", 96), req("p", 200, computed_tokens=64), req("q", 100, computed_tokens=32)]
    tr = {"u": 0.1, "p": 4.0, "q": 9.0}
    s = state(ordered, max_budget=8192, block_size=32, free_kv_blocks=0, remaining_time=tr, urgent_s=T_MAX)
    selected = select(s, 512, None, 0.01)
    assert (_chunks(selected), selected.preempted) == ([("u", 96)], ("q", "p"))


def test_alg1_never_preempts_a_member_with_less_time_than_the_urgent_one() -> None:
    # the only holder, decoding d (48 tokens computed → 2 blocks) has T_r 0.01 < u's 0.1: nothing is preempted,
    # and u takes what the 2 free blocks hold, 64 of its 96 tokens
    ordered = [req("u", 96)]
    d = ReqView("d", 40, 16, 0.0, computed_tokens=48)
    tr = {"u": 0.1, "d": 0.01}
    s = state(ordered, block_size=32, free_kv_blocks=2, remaining_time=tr, urgent_s=T_MAX, batch=(d,))
    selected = select(s, 512, None, 0.01)
    assert (_chunks(selected), selected.preempted) == ([("u", 64)], ())


def test_alg1_on_a_colocated_engine_may_preempt_a_decoding_request_by_its_tbt_slo() -> None:
    # d decodes (prompt 40, 48 tokens computed → 2 blocks = 64 tokens); as a TG task its T_r = SLO_TBT − T_max =
    # 5.5 − 0.5 = 5.0. u: TTFT SLO 0.6, just arrived, one chunk: T_r = 0.6 − 0 − 0.5 = 0.1, urgent.
    # Free KV 1 block (32) < u's 96: d goes, A_m = 32 + 64 = 96
    queue = AccelGenRemainingTime(linear_cost())
    d = ReqView("d", 40, 16, 0.0, computed_tokens=48, tbt_slo_s=5.5)
    u = req("u", 96, arrival=10.0, ttft_slo_s=0.6)
    tr = queue.remaining_times([u, d], now=10.0)
    assert tr == pytest.approx({"u": 0.1, "d": 5.0})
    s = state([u], block_size=32, free_kv_blocks=1, remaining_time=tr, urgent_s=T_MAX, batch=(d,))
    selected = select(s, 512, None, 0.01)
    assert (_chunks(selected), selected.preempted) == ([("u", 96)], ("d",))


def test_a_tg_task_without_a_tbt_slo_takes_the_reading_speed() -> None:
    # AccelGen §4.3's default TBT, 0.1875 s a token: T_r = 0.1875 − T_max 0.5 = −0.3125; a waiting prompt
    # without any SLO still has T_r = ∞
    queue = AccelGenRemainingTime(linear_cost())
    assert queue.remaining_time(ReqView("d", 40, 16, 0.0, computed_tokens=41), now=3.0) == pytest.approx(-0.3125)
    assert queue.remaining_time(ReqView("w", 40, 16, 0.0), now=3.0) == math.inf


def test_dynamic_chunking_counts_each_preemption_under_accelgen() -> None:
    policy = DynamicChunking(linear_cost(), select="multi-resource")
    ordered = [req("u", 96), req("p", 200, computed_tokens=64), req("q", 100, computed_tokens=32)]
    s = state(ordered, block_size=32, free_kv_blocks=0, remaining_time={"u": 0.1, "p": 4.0, "q": 9.0}, urgent_s=0.5)
    assert policy.preempted(s) == ["q", "p"]
    assert [c.request_id for c in policy.plan(s)] == ["u"]  # the same iteration: solved once, counted once
    assert policy.decisions.snapshot() == {"preempted": 2}


def test_the_planner_hands_alg1_victims_to_the_adapter() -> None:
    # accelgen + dynamic + multi-resource: u's TTFT SLO 0.6 s, arrived at 10.0: T_r = 0.6 − 0 − 0.5 = 0.1;
    # S_b = 512·0.6/0.5 = 614. q (in progress, 32 computed, no SLO: T_r = ∞) holds the one block u lacks
    planner = PrefillPlanner(build_prefill_policy(MULTI, linear_cost()))
    assert planner.preempts
    views = [req("u", 96, arrival=10.0, ttft_slo_s=0.6), req("q", 100, arrival=9.0, computed_tokens=32)]
    plan = planner.plan(views, KVPool(8192, 32, free_blocks=2), now=10.0)
    assert [(c.request_id, c.tokens) for c in plan.chunks] == [("u", 96)]
    assert (plan.preempt, plan.budget) == (("q",), 614)


# -- Alg. 2's groups: γ in iterations of T_max ----------------------------------------------------------------------


def test_a_prompt_longer_than_the_whole_budget_is_cut_and_finishes() -> None:
    # no remaining times (one group, nothing urgent); S_b = 384 tokens, ERA's threshold 4096: a 514-token prompt
    # never has D_c ≤ A_c whole, so it is cut to 384, then its last 130 tokens go whole with the next prompt
    big = req("big", 514, arrival=1.0)
    first = select(state([big], block_size=32), 384, long_prompt_tokens=4096, window_s=1.0)
    assert _chunks(first) == [("big", 384)]
    after = req("big", 514, arrival=1.0, computed_tokens=384)
    second = select(state([after, req("s", 100, arrival=2.0)], block_size=32), 384, 4096, 1.0)
    assert _chunks(second) == [("big", 130), ("s", 100)]
    # a prompt at most S_b long is still taken whole or not at all
    assert _chunks(select(state([req("b", 300), req("c", 200)], block_size=32), 384, 4096, 1.0)) == [("b", 300)]


def test_alg2_groups_within_gamma_given_in_iterations_of_t_max() -> None:
    # γ = 4 iterations · T_max 0.5 s = 2.0 s (AccelGen §6.1's 0.75 s is four iterations of at most 0.1875 s).
    # T_r: g1 1.0, g2 2.9, h1 3.5. First group: T_r ≤ 1.0 + 2.0 = 3.0 → {g1, g2}. A_c = S_b = 512:
    # g1 leaves 412, g2 leaves 112 → g2; then g1 (100 ≤ 112), A_c = 12; next group {h1}: 12 ≤ 12
    ordered = [req("g1", 100), req("g2", 400), req("h1", 12)]
    tr = {"g1": 1.0, "g2": 2.9, "h1": 3.5}
    policy = DynamicChunking(linear_cost(), select="multi-resource", group_window_iters=4.0)
    assert policy.window_s() == 2.0
    s = state(ordered, max_budget=8192, remaining_time=tr)
    assert [(c.request_id, c.tokens) for c in policy.plan(s)] == [("g2", 400), ("g1", 100), ("h1", 12)]
    # with γ = 0.01 s every request is a group of its own: g1 (A_c 412), g2 (A_c 12), h1
    narrow = DynamicChunking(linear_cost(), select="multi-resource", group_window_s=0.01)
    assert [c.request_id for c in narrow.plan(state(ordered, max_budget=8192, remaining_time=tr))] == [
        "g1",
        "g2",
        "h1",
    ]


def test_the_config_carries_the_papers_defaults_to_the_policies() -> None:
    cfg = ClusterConfig(
        prefill={"queue_policy": "accelgen", "chunking": "dynamic", "chunk_selection": "multi-resource"}
    )
    params = AccelGenParams.from_config(cfg.prefill)
    assert params == AccelGenParams(group_window_iters=4.0, long_prompt_tokens=4096, preempt_max_iters=1.0)
    policy = build_prefill_policy(MULTI, linear_cost(), params)
    assert isinstance(policy.chunking, DynamicChunking) and isinstance(policy.queue, AccelGenRemainingTime)
    assert (policy.chunking.group_window_iters, policy.chunking.long_prompt_tokens) == (4.0, 4096)
    assert policy.queue.preempt_penalty_s() == 0.0  # P = 0: P_max · P = 1 · 0.5 s · 0
    pick = AccelGenParams(long_prompt_tokens=None, preempt_max_iters=2.0, preempt_probability=0.1)
    policy = build_prefill_policy(MULTI, linear_cost(), pick)
    assert isinstance(policy.chunking, DynamicChunking) and isinstance(policy.queue, AccelGenRemainingTime)
    assert policy.chunking.long_prompt_tokens == 512  # None: the pivot S_pf
    assert policy.queue.preempt_penalty_s() == pytest.approx(0.1)  # 2 iterations · 0.5 s · 0.1


# -- S_g: the length estimate on the views ----------------------------------------------------------------------


def test_the_jct_path_reads_s_g_from_the_estimate() -> None:
    # one chunk (100 ≤ 512), SLO_JCT 31.5 s. S_g = estimate 20 (≤ max_tokens 64): T_e = 0.5 + 20·0.5 = 10.5,
    # T_it = (31.5 − 10.5)/(1 + 20) = 1.0. Without an estimate S_g = max_tokens 64: T_e = 0.5 + 64·0.5 = 32.5,
    # T_it = (31.5 − 32.5)/65 = −0.0153846
    queue = AccelGenRemainingTime(linear_cost())
    with_estimate = ReqView("j", 100, 64, 0.0, estimate=LengthEstimate(10, 20, 40), jct_slo_s=31.5)
    assert with_estimate.expected_output() == 20
    assert queue.iteration_allowance(with_estimate) == pytest.approx(1.0)
    assert queue.iteration_allowance(ReqView("j", 100, 64, 0.0, jct_slo_s=31.5)) == pytest.approx(-0.0153846, abs=1e-7)


def _engine_request(tags: EngineTags, engine_max_tokens: int = 1, rid: str = "r-v") -> SimpleNamespace:
    params = SimpleNamespace(max_tokens=engine_max_tokens, extra_args=tags.extra())
    return SimpleNamespace(
        request_id=rid, num_prompt_tokens=100, num_computed_tokens=0, arrival_time=0.0, sampling_params=params
    )


def test_the_engine_view_takes_the_estimate_and_the_clients_cap_from_the_tags_and_a_late_prediction() -> None:
    # the prefill engine runs the request with max_tokens = 1; the tags carry the client's 64 and the instant
    # estimate 20, so S_g = 20 (not 1); a late prediction of 60 replaces it at the next iteration
    tags = EngineTags(request_id="r", arrival=0.0, jct_slo_s=31.5, estimate=LengthEstimate(10, 20, 40), max_tokens=64)
    engine_req = _engine_request(tags)
    prompts = PromptPlanning(8192)
    view = prompts._view(engine_req)  # type: ignore[arg-type]
    assert (view.max_tokens, view.expected_output()) == (64, 20)
    sched = SimpleNamespace(requests={"r-v": engine_req})
    assert prompts.retag(sched, "r", LengthEstimate(50, 60, 70))  # type: ignore[arg-type]
    assert prompts._view(engine_req).expected_output() == 60  # type: ignore[arg-type]
    assert not prompts.retag(sched, "other", LengthEstimate(1, 1, 1))  # type: ignore[arg-type]
    # untagged cap (a colocated engine runs the client's max_tokens): the engine's own
    plain = _engine_request(EngineTags(request_id="c"), engine_max_tokens=48, rid="c-v")
    assert prompts._view(plain).max_tokens == 48  # type: ignore[arg-type]


def test_the_gate_orders_the_next_batch_by_the_estimate_once_it_is_out() -> None:
    # PrefillSchedBatch 2, both places taken; two JCT requests wait (SLO 31.5 s, 100 tokens, both queued since
    # 0): with the instant estimate 20 each has T_it = 1.0 and arrival order holds (a, then b). b's prediction,
    # 64 tokens, gives it T_it = −0.0153846: b is next in line
    async def run() -> list[str]:
        gate = SchedBatchGate(AccelGenRemainingTime(linear_cost()), 2)
        instant = LengthEstimate(10, 20, 40)

        def view(rid: str, arrival: float, estimate: LengthEstimate) -> ReqView:
            return ReqView(rid, 100, 64, arrival, estimate=estimate, jct_slo_s=31.5, queued_since=0.0)

        busy = [asyncio.create_task(_enter(gate, view(f"busy{i}", -1.0, instant))) for i in range(2)]
        await asyncio.sleep(0.01)
        waiters = [
            asyncio.create_task(_enter(gate, view("a", 0.0, instant))),
            asyncio.create_task(_enter(gate, view("b", 0.1, instant))),
        ]
        await asyncio.sleep(0.01)
        before = gate.next_in_line()
        gate.update(view("b", 0.1, LengthEstimate(60, 64, 64)))
        after = gate.next_in_line()
        for t in (*busy, *waiters):
            t.cancel()
        assert before is not None and after is not None
        return [before.request_id, after.request_id]

    assert asyncio.run(run()) == ["a", "b"]


async def _enter(gate: SchedBatchGate, view: ReqView) -> None:
    async with gate.turn(view):
        await asyncio.sleep(3600)


# -- the adapter: Alg. 1's victims preempted through vLLM's own preemption -------------------------------------


class _Queue:
    def __init__(self, reqs: list[Any]) -> None:
        self.reqs = list(reqs)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.reqs))

    def remove_requests(self, reqs: Any) -> None:
        for r in list(reqs):
            self.reqs.remove(r)

    def add_request(self, r: Any) -> None:
        self.reqs.append(r)

    def prepend_request(self, r: Any) -> None:
        self.reqs.insert(0, r)


class _Sched:
    """The part of vLLM's scheduler ``PromptPlanning.expose`` uses; ``_preempt_request`` as vLLM's: the KV
    freed, the request back at the head of the waiting queue from its first token."""

    def __init__(self, running: list[Any], waiting: list[Any], free_blocks: int) -> None:
        self.running, self.waiting = list(running), _Queue(waiting)
        self.block_size, self.requires_kv_delivery = 32, False
        pool = SimpleNamespace(get_num_free_blocks=lambda: free_blocks, num_gpu_blocks=max(64, free_blocks))
        self.kv_cache_manager = SimpleNamespace(block_pool=pool)
        self.max_num_scheduled_tokens = 8192
        self.preempted: list[str] = []

    def _preempt_request(self, request: Any, timestamp: float, drop_stale_output: bool = False) -> None:
        self.preempted.append(request.request_id)
        request.num_computed_tokens = 0
        self.waiting.prepend_request(request)


def _vllm_req(rid: str, prompt: int, computed: int, **tags: Any) -> SimpleNamespace:
    params = SimpleNamespace(max_tokens=16, extra_args=EngineTags(request_id=rid, **tags).extra())
    return SimpleNamespace(
        request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=computed, arrival_time=0.0, sampling_params=params
    )


def test_expose_preempts_the_victim_and_shows_vllm_only_the_urgent_prompt() -> None:
    # colocated: d decodes (prompt 40, 48 computed → 2 blocks, TBT 5.5 s: T_r = 5.0); u waits (96 tokens, TTFT
    # 0.6 s, arrived now: T_r = 0.1, urgent). One free block (32) < u's 96: d is preempted (32 + 64 = 96)
    now = 100.0
    d = _vllm_req("d", 40, 48, tbt_slo_s=5.5, arrival=90.0)
    u = _vllm_req("u", 96, 0, ttft_slo_s=0.6, arrival=now)
    sched = _Sched(running=[d], waiting=[u], free_blocks=1)
    prompts = PromptPlanning(8192)
    prompts.planner.policy = build_prefill_policy(MULTI, linear_cost())
    exposed = prompts.expose(sched, now)  # type: ignore[arg-type]
    assert sched.preempted == ["d"]
    assert (sched.running, [r.request_id for r in sched.waiting]) == ([], ["u"])
    assert sched.max_num_scheduled_tokens == 96  # u's 96 tokens, no decoding request left
    prompts.restore(sched, exposed)  # type: ignore[arg-type]
    assert sorted(r.request_id for r in sched.waiting) == ["d", "u"]
    assert prompts.planner.policy.chunking.decisions.snapshot() == {"preempted": 1}  # type: ignore[attr-defined]
