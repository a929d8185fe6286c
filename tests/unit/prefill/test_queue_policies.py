"""Queue policies: TetriInfer §3.3.1 FCFS/SJF/LJF, AccelGen §4.3 remaining time, SOLA §4.4.2 predicted TTFT."""

from __future__ import annotations

import math

import pytest

from tests.prefill_support import linear_cost, req
from tetriserve.prefill_worker.queue import QUEUE_POLICY_NAMES, make_queue_policy
from tetriserve.prefill_worker.queue.accelgen import AccelGenRemainingTime
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.queue.length_order import LJF, SJF
from tetriserve.prefill_worker.queue.sola import SolaTTFT


def ids(views: list) -> list[str]:  # type: ignore[type-arg]
    return [v.request_id for v in views]


def test_fcfs_orders_by_arrival_then_id_and_leaves_input_alone() -> None:
    waiting = [req("c", 5, 3.0), req("b", 5, 1.0), req("z", 5, 2.0), req("a", 5, 1.0)]
    assert ids(FCFS().order(waiting, now=10.0)) == ["a", "b", "z", "c"]
    assert ids(waiting) == ["c", "b", "z", "a"]
    assert FCFS().order([], now=0.0) == []


def test_sjf_and_ljf_sort_by_prompt_length_ties_by_arrival() -> None:
    waiting = [req("a", 300, 0.0), req("b", 20, 1.0), req("c", 300, 2.0), req("d", 5, 3.0)]
    assert ids(SJF().order(waiting, 9.0)) == ["d", "b", "a", "c"]
    assert ids(LJF().order(waiting, 9.0)) == ["a", "c", "b", "d"]


def test_length_order_keeps_scheduled_batches_in_sequence() -> None:
    # PrefillSchedBatch bounds starvation: a short prompt of batch 2 never overtakes a long one of batch 1
    waiting = [
        req("long1", 900, 0.0, batch_seq=1),
        req("short2", 3, 5.0, batch_seq=2),
        req("mid1", 50, 1.0, batch_seq=1),
    ]
    assert ids(SJF().order(waiting, 9.0)) == ["mid1", "long1", "short2"]
    assert ids(LJF().order(waiting, 9.0)) == ["long1", "mid1", "short2"]
    assert ids(FCFS().order(waiting, 9.0)) == ["long1", "mid1", "short2"]


def test_sjf_keeps_a_chunked_prompt_in_its_place() -> None:
    # ordering is by prompt length, not what is left, so a prompt half done does not jump the queue
    waiting = [req("a", 10, 0.0, computed_tokens=8), req("b", 5, 1.0)]
    assert ids(SJF().order(waiting, 2.0)) == ["b", "a"]


def test_accelgen_remaining_time_formula() -> None:
    # T_r = SLO − T_w − N_ck·T_max with T_max = 0.5 s and L_c = 512: a 1000-token prompt has 2 chunks left
    policy = AccelGenRemainingTime(linear_cost())
    r = req("a", 1000, arrival=10.0, ttft_slo_s=3.0)
    assert policy.remaining_time(r, now=10.4) == pytest.approx(3.0 - 0.4 - 2 * 0.5)
    half = req("a", 1000, arrival=10.0, ttft_slo_s=3.0, computed_tokens=512)  # one chunk left
    assert policy.remaining_time(half, now=10.4) == pytest.approx(3.0 - 0.4 - 1 * 0.5)
    assert policy.remaining_time(req("x", 10), now=10.4) == math.inf


def test_accelgen_orders_by_remaining_time_urgent_first_then_no_slo_by_arrival() -> None:
    policy = AccelGenRemainingTime(linear_cost())
    waiting = [
        req("loose", 100, arrival=0.0, ttft_slo_s=10.0),
        req("none-early", 100, arrival=0.1),
        req("urgent", 100, arrival=0.5, ttft_slo_s=1.2),  # T_r = 1.2 − 0.5 − 0.5 = 0.2 ≤ T_max: urgent
        req("tight", 100, arrival=0.2, ttft_slo_s=2.0),
        req("none-late", 100, arrival=0.3),
    ]
    assert ids(policy.order(waiting, now=1.0)) == ["urgent", "tight", "loose", "none-early", "none-late"]


def test_accelgen_jct_slo_becomes_a_per_iteration_allowance_with_carry_over() -> None:
    # S_g = 16 predicted tokens (max_tokens), one chunk: T_e = 0.5 + 16·0.5 = 8.5; T_it = (SLO − T_e)/(1 + 16)
    policy = AccelGenRemainingTime(linear_cost())
    r = req("j", 100, arrival=0.0, jct_slo_s=25.5, queued_since=0.0)
    assert policy.iteration_allowance(r) == pytest.approx((25.5 - 8.5) / 17)  # 1.0 s
    assert policy.remaining_time(r, now=0.25) == pytest.approx(0.75)
    policy.on_scheduled([r], now=0.25)  # ran 0.75 s early: the next iteration may wait 1.75 s
    r2 = req("j", 100, arrival=0.0, jct_slo_s=25.5, queued_since=1.0)
    assert policy.remaining_time(r2, now=1.0) == pytest.approx(1.75)
    policy.on_scheduled([r2], now=3.0)  # waited 2.0 of 1.75: 0.25 s late, taken from the next allowance
    r3 = req("j", 100, arrival=0.0, jct_slo_s=25.5, queued_since=3.0)
    assert policy.remaining_time(r3, now=3.0) == pytest.approx(1.0 - 0.25)
    policy.forget("j")
    assert policy.remaining_time(r3, now=3.0) == pytest.approx(1.0)


def test_sola_orders_by_predicted_ttft_descending() -> None:
    # predicted TTFT = (now − arrival) + C^p(remaining); 1 ms per token
    policy = SolaTTFT(linear_cost())
    waiting = [req("old-short", 100, arrival=0.0), req("new-long", 2000, arrival=0.9), req("mid", 500, arrival=0.5)]
    # old-short: 1.0 + 0.1 = 1.1; new-long: 0.1 + 2.0 = 2.1; mid: 0.5 + 0.5 = 1.0
    assert policy.predicted_ttft(waiting[1], now=1.0) == pytest.approx(2.1)
    assert ids(policy.order(waiting, now=1.0)) == ["new-long", "old-short", "mid"]
    assert policy.decisions.snapshot() == {"reordered": 1}  # arrival order is old-short, mid, new-long
    policy.order([req("x", 100, arrival=0.0), req("y", 100, arrival=0.5)], now=1.0)  # x 1.1, y 0.6: arrival order
    assert policy.decisions.snapshot() == {"reordered": 1}


def test_sola_uses_the_online_corrected_cost() -> None:
    cost = linear_cost()
    policy = SolaTTFT(cost)
    r = req("a", 1000, arrival=0.0)
    before = policy.predicted_ttft(r, now=0.0)
    for _ in range(50):
        cost.observe_prefill([(0, 512)], 2 * 0.512)  # iterations take twice what the profile says
    assert policy.predicted_ttft(r, now=0.0) == pytest.approx(2 * before, rel=0.01)


def test_registry_builds_each_and_names_the_field_on_errors() -> None:
    cost = linear_cost()
    for name in QUEUE_POLICY_NAMES:
        assert make_queue_policy(name, cost).name == name
    with pytest.raises(ValueError, match=r"prefill\.queue_policy: unknown policy 'lifo'"):
        make_queue_policy("lifo")
    for name in ("accelgen", "sola"):
        with pytest.raises(ValueError, match=r"needs a cost model \(prefill\.cost_profile\)"):
            make_queue_policy(name)
