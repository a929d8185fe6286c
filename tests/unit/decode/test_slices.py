"""SCLS slice rebalancing (§4.5 max-min, §4.6 eq. 12, §7) on hand-built loads and batches."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from tetriserve.common.length import LengthEstimate
from tetriserve.common.load import DecodeLoad
from tetriserve.decode_worker.slices import (
    Order,
    SliceMoves,
    load_s,
    min_interval,
    next_interval,
    pick_movers,
    plan,
    token_costs,
)
from tetriserve.decode_worker.views import DecodeReqView


def _load(wid: str, remaining: int, running: int = 4, step_s: float = 0.04, **kw: object) -> DecodeLoad:
    fields: dict[str, object] = {
        "free_kv_blocks": 100,
        "total_kv_blocks": 100,
        "block_size": 16,
        "queued": 0,
        "heavy": 0,
        "light": 0,
        "at": 0.0,
        "remaining_tokens": remaining,
        "step_s": step_s,
        "slice_iters": 32,
        **kw,
    }
    return DecodeLoad(wid, running=running, **fields)  # type: ignore[arg-type]


def _req(rid: str, remaining: int, context: int = 100, transferring: bool = False) -> DecodeReqView:
    est = LengthEstimate(remaining, remaining, remaining + 1, source="oracle")
    return DecodeReqView(rid, context, 4096, estimate=est, transferring=transferring)


def _order(src_s: float, dst_s: float, free: int = 100, cost: float = 0.01) -> Order:
    return Order("decode-0", "decode-1", src_s, dst_s, cost, cost, free, 16)


# ---- loads in seconds --------------------------------------------------------------------------


def test_load_is_remaining_tokens_at_the_workers_own_cost_per_token() -> None:
    busy = _load("decode-0", 1000, running=4, step_s=0.04)  # 10 ms a token
    costs = token_costs([busy])
    assert costs == {"decode-0": pytest.approx(0.01)}
    assert load_s(busy, costs["decode-0"]) == pytest.approx(10.0)


def test_an_idle_worker_is_priced_at_the_median_of_the_others() -> None:
    loads = [_load("a", 10, 2, 0.02), _load("b", 10, 1, 0.03), _load("c", 10, 4, 0.2), _load("idle", 0, 0, 0.0)]
    assert token_costs(loads)["idle"] == pytest.approx(0.03)
    assert token_costs([_load("idle", 5, 0, 0.0)]) == {"idle": 1.0}  # nobody known: loads stay in tokens


# ---- eq. 12 --------------------------------------------------------------------------------------


def test_interval_is_lambda_times_the_least_load_but_at_least_gamma() -> None:
    loads = [_load("a", 1000), _load("b", 400)]  # 10 s and 4 s
    assert next_interval(loads, lam=0.5, gamma_s=1.0) == pytest.approx(2.0)
    assert next_interval(loads, lam=0.1, gamma_s=1.0) == 1.0
    assert next_interval([], lam=0.5, gamma_s=3.0) == 3.0


def test_interval_is_gamma_while_no_worker_has_a_time_per_token_yet() -> None:
    # a burst whose requests all still wait for their KV: loads are in tokens, not seconds
    waiting = [_load("a", 2000, running=0, step_s=0.0), _load("b", 900, running=0, step_s=0.0)]
    assert next_interval(waiting, lam=0.5, gamma_s=1.0) == 1.0


def test_gamma_in_decode_iterations_at_the_median_step_time() -> None:
    # Γ = 128 steps: the median of 0.02, 0.03 and 0.05 s is 0.03 s, so Γ = 128·0.03 = 3.84 s
    loads = [_load("a", 1000, 2, 0.02), _load("b", 1000, 2, 0.05), _load("c", 1000, 2, 0.03)]
    assert min_interval(loads, gamma_s=1.0, gamma_iters=128) == pytest.approx(3.84)
    # least load: 1000 tokens at 0.01 s each = 10 s; λ·10 = 5 s > Γ = 3.84 s
    assert next_interval(loads, lam=0.5, gamma_s=1.0, gamma_iters=128) == pytest.approx(5.0)
    # λ = 0.1: 1 s < Γ = 3.84 s
    assert next_interval(loads, lam=0.1, gamma_s=1.0, gamma_iters=128) == pytest.approx(3.84)
    # no step time reported yet, or Γ given in seconds: gamma_s
    idle = [_load("a", 100, 0, 0.0)]
    assert min_interval(idle, gamma_s=1.0, gamma_iters=128) == 1.0
    assert min_interval(loads, gamma_s=1.0, gamma_iters=0) == 1.0
    assert next_interval(idle, lam=0.5, gamma_s=1.0, gamma_iters=128) == 1.0


# ---- max-min pairing -------------------------------------------------------------------------


def test_most_loaded_gives_to_least_loaded_then_the_next_pair() -> None:
    loads = [_load("a", 100), _load("b", 900), _load("c", 500), _load("d", 50)]
    orders = plan(loads)
    assert [(o.src, o.dst) for o in orders] == [("b", "d"), ("c", "a")]
    assert orders[0].src_load_s == pytest.approx(9.0) and orders[0].dst_load_s == pytest.approx(0.5)


def test_only_slicing_busy_workers_give_and_only_accepting_ones_take() -> None:
    loads = [
        _load("no-slices", 900, slice_iters=0),  # the most loaded, but its requests stay
        _load("closed", 0, running=0, accepting=False),  # the least loaded, but takes nothing
        _load("src", 500),
        _load("idle", 0, running=0),
        _load("busy", 100),
    ]
    assert [(o.src, o.dst) for o in plan(loads)] == [("src", "idle")]


def test_balanced_or_single_workers_get_no_order() -> None:
    assert plan([_load("a", 100), _load("b", 100)]) == []
    assert plan([_load("a", 900)]) == []


# ---- which requests move ---------------------------------------------------------------------


def test_longest_remaining_moves_first_while_the_gap_narrows() -> None:
    running = [_req("short", 40), _req("long", 300), _req("mid", 150), _req("mid2", 120)]
    # src 10 s, dst 2 s, 10 ms a token: long (3 s) → 7 vs 5; mid (1.5 s) and mid2 (1.2 s) would overshoot
    # (5.5 vs 6.5, 5.8 vs 6.2); short (0.4 s) still fits the gap → 6.6 vs 5.4
    assert pick_movers(running, _order(10.0, 2.0), slice_iters=32) == ["long", "short"]
    assert pick_movers(running, _order(20.0, 0.0), slice_iters=32) == ["long", "mid", "mid2", "short"]


def test_requests_finishing_within_a_slice_stay() -> None:
    assert pick_movers([_req("a", 32), _req("b", 10)], _order(100.0, 0.0), slice_iters=32) == []


def test_a_request_whose_kv_is_in_flight_stays() -> None:
    running = [_req("moving", 300, transferring=True), _req("b", 200)]
    assert pick_movers(running, _order(100.0, 0.0), slice_iters=32) == ["b"]


def test_destination_without_room_for_the_context_gets_nothing_that_does_not_fit() -> None:
    running = [_req("big", 300, context=1000), _req("small", 200, context=60)]
    # (60 + 32) tokens = 6 blocks of 16 fit in 7 free blocks; 1032 tokens do not
    assert pick_movers(running, _order(100.0, 0.0, free=7), slice_iters=32) == ["small"]


def test_a_move_never_leaves_the_destination_above_the_source() -> None:
    # moving the only long request would make the destination the loaded one: it stays
    assert pick_movers([_req("long", 600)], _order(7.0, 2.0), slice_iters=32) == []


def test_moves_are_counted_by_name() -> None:
    moves = SliceMoves(moved_out=2, kept=1)
    assert moves.summary() == {"slice_moved_out": "2", "slice_moved_in": "0", "slice_kept": "1"}


def test_estimate_after_tokens_generated() -> None:
    est = LengthEstimate(100, 150, 200, 3, 0.8, "trained")
    assert est.after(120) == LengthEstimate(0, 30, 80, 3, 0.8, "trained")
    assert est.after(0) is est and est.after(500).upper == 0


# ---- the decode worker's side of an order ------------------------------------------------------


class _Scheduler:
    """What ``SliceMover.rebalance`` uses of the scheduler subclass (through the engine)."""

    def __init__(self, running: list[DecodeReqView]) -> None:
        self.running = running
        self.marks: dict[str, str] = {}

    def mark_moving(self, request_id: str, key: str) -> None:
        self.marks[request_id] = key


class _Engine:
    """What the worker uses of ``EngineLoop``: the published snapshot, ``call`` into the scheduler."""

    def __init__(self, sched: _Scheduler) -> None:
        self.sched = sched

    @property
    def snapshot(self) -> Any:
        from types import SimpleNamespace

        from tetriserve.decode_worker.views import DecodeSnapshot

        return SimpleNamespace(extra=DecodeSnapshot(0, 0.0, tuple(self.sched.running), {}))

    async def call(self, fn: Any) -> Any:
        return fn(self.sched)


def _worker(running: list[DecodeReqView]) -> tuple[Any, _Scheduler]:
    from tetriserve.common.config import DecodeConfig
    from tetriserve.common.request import Request
    from tetriserve.decode_worker.moves import SliceMover
    from tetriserve.decode_worker.worker import DecodeWorker, Running

    sched = _Scheduler(running)
    worker = DecodeWorker.__new__(DecodeWorker)  # no engine: just what ``rebalance`` needs
    worker.worker_id = "decode-0"
    worker.engine = _Engine(sched)
    worker._decode_cfg = DecodeConfig(slice_iters=32)
    worker.mover = SliceMover(worker)
    worker.running = {
        v.request_id: Running(Request(v.request_id, (1, 2), length_estimate=v.estimate), "fd", False) for v in running
    }
    return worker, sched


def _rebalance(worker: Any, order: Order) -> list[str]:
    return asyncio.run(worker.rebalance(order, "d1:1", object()))


def test_a_marked_request_keeps_its_key_when_a_later_order_comes_before_it_has_moved() -> None:
    # the engine may already have cut it (its KV parked under the first key) while still listing it as running
    worker, sched = _worker([_req("long", 300)])
    assert _rebalance(worker, _order(100.0, 0.0)) == ["long"]
    first = sched.marks["long"]
    assert _rebalance(worker, _order(100.0, 0.0)) == []
    assert sched.marks["long"] == first and worker.running["long"].move.key == first


def test_a_worker_without_slices_or_an_order_for_another_worker_marks_nothing() -> None:
    from tetriserve.common.config import DecodeConfig

    worker, sched = _worker([_req("long", 300)])
    assert _rebalance(worker, replace(_order(100.0, 0.0), src="decode-9")) == []
    worker._decode_cfg = DecodeConfig(slice_iters=0)
    assert _rebalance(worker, _order(100.0, 0.0)) == [] and not sched.marks
