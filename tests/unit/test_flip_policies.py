"""Flip policies (control_plane/flip) from hand-built cluster snapshots: no Ray, no engines."""

from __future__ import annotations

import pytest

from tetriserve.common.lifecycle import Lifecycle
from tetriserve.common.load import Role
from tetriserve.control_plane.flip import (
    FLIP_POLICY_NAMES,
    Attainment,
    ClusterSnapshot,
    FlipOrder,
    RemoveOrder,
    ScaleOrder,
    WorkerView,
    make_flip_policy,
)
from tetriserve.control_plane.flip.slo import SloFlip, SloParams
from tetriserve.control_plane.flip.tetriinfer import TetriInferFlip, TetriInferParams

P, D = Role.PREFILL, Role.DECODE
ACTIVE = Lifecycle.ACTIVE


def w(worker_id: str, role: Role, load: float, state: Lifecycle = ACTIVE) -> WorkerView:
    return WorkerView(worker_id, role, state, load)


def snap(
    now: float,
    *workers: WorkerView,
    ttft: float | None = None,
    tpot: float | None = None,
    samples: int = 0,
    max_workers: int = 0,
) -> ClusterSnapshot:
    return ClusterSnapshot(now, tuple(workers), Attainment(ttft, tpot, samples), max_workers)


# -- registry ------------------------------------------------------------------------------------------------
def test_registry_builds_each_policy_and_names_bad_input() -> None:
    for name in FLIP_POLICY_NAMES:
        assert make_flip_policy(name).name == name
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_flip_policy("nope")
    with pytest.raises(ValueError, match=r"tetriinfer.*bogus"):
        make_flip_policy("tetriinfer", bogus=1)
    with pytest.raises(ValueError, match=r"flip\.min_decode"):
        make_flip_policy("tetriinfer", min_decode=0)
    with pytest.raises(ValueError, match=r"flip\.max_decode"):
        make_flip_policy("slo", min_decode=2, max_decode=1)
    with pytest.raises(ValueError, match="load_threshold"):
        make_flip_policy("tetriinfer", load_threshold=1.5)


def test_off_never_orders_anything() -> None:
    policy = make_flip_policy("off")
    assert (
        policy.decide(
            snap(
                1e6, w("p0", P, 0.0), w("d0", D, 1.0), w("d1", D, 0.0), ttft=0.1, tpot=0.1, samples=1000, max_workers=10
            )
        )
        == []
    )


# -- tetriinfer ----------------------------------------------------------------------------------------------
def test_tetriinfer_flips_a_worker_idle_for_the_interval_to_the_loaded_side() -> None:
    policy = TetriInferFlip(TetriInferParams(load_threshold=0.1, interval_s=60))
    workers = (w("p0", P, 0.9), w("d0", D, 0.5), w("d1", D, 0.05))
    assert policy.decide(snap(0, *workers)) == []  # idle from now on
    assert policy.decide(snap(59.9, *workers)) == []  # not for a minute yet
    orders = policy.decide(snap(60, *workers))
    assert orders == [FlipOrder("d1", P, orders[0].reason)]
    assert "60 s" in orders[0].reason and "10%" in orders[0].reason


def test_tetriinfer_idleness_must_be_continuous_and_in_the_current_role() -> None:
    policy = TetriInferFlip(TetriInferParams(interval_s=60))
    policy.decide(snap(0, w("p0", P, 0.9), w("d0", D, 0.5), w("d1", D, 0.0)))
    policy.decide(snap(30, w("p0", P, 0.9), w("d0", D, 0.5), w("d1", D, 0.2)))  # busy once: the clock restarts
    assert policy.decide(snap(80, w("p0", P, 0.9), w("d0", D, 0.5), w("d1", D, 0.0))) == []
    assert policy.decide(snap(140, w("p0", P, 0.9), w("d0", D, 0.5), w("d1", D, 0.0)))[0].worker_id == "d1"


def test_tetriinfer_keeps_one_worker_per_role_and_flips_one_at_a_time() -> None:
    policy = TetriInferFlip(TetriInferParams(interval_s=10))
    lone = (w("p0", P, 0.0), w("d0", D, 0.9))  # p0 idle, but the only prefill worker
    policy.decide(snap(0, *lone))
    assert policy.decide(snap(100, *lone)) == []
    settling = (w("p0", P, 0.9), w("d0", D, 0.0), w("d1", D, 0.0), w("d2", D, 0.5, Lifecycle.DRAINING))
    policy.decide(snap(100, *settling))
    assert policy.decide(snap(200, *settling)) == []  # a flip is under way


def test_tetriinfer_picks_the_longest_idle_and_needs_demand_on_the_other_side() -> None:
    policy = TetriInferFlip(TetriInferParams(interval_s=10))
    policy.decide(snap(0, w("p0", P, 0.5), w("d0", D, 0.5), w("d1", D, 0.0), w("d2", D, 0.5)))
    policy.decide(snap(5, w("p0", P, 0.5), w("d0", D, 0.5), w("d1", D, 0.0), w("d2", D, 0.0)))
    assert (
        policy.decide(snap(20, w("p0", P, 0.5), w("d0", D, 0.5), w("d1", D, 0.0), w("d2", D, 0.0)))[0].worker_id == "d1"
    )
    quiet = TetriInferFlip(TetriInferParams(interval_s=10))  # both sides idle: nothing to gain by flipping
    for t in (0, 100):
        orders = quiet.decide(snap(t, w("p0", P, 0.0), w("d0", D, 0.0), w("d1", D, 0.0)))
    assert orders == []
    eager = TetriInferFlip(TetriInferParams(interval_s=10, require_demand=False))  # the paper's rule alone
    for t in (0, 100):
        orders = eager.decide(snap(t, w("p0", P, 0.0), w("d0", D, 0.0), w("d1", D, 0.0)))
    assert [o.worker_id for o in orders] == ["d0"]


def test_tetriinfer_restarts_the_clock_after_ordering_and_for_a_worker_in_a_new_role() -> None:
    policy = TetriInferFlip(TetriInferParams(interval_s=10))
    policy.decide(snap(0, w("p0", P, 0.9), w("d0", D, 0.9), w("d1", D, 0.0)))
    assert policy.decide(snap(10, w("p0", P, 0.9), w("d0", D, 0.9), w("d1", D, 0.0)))
    # d1 now serves prefill and is idle there: it needs a full interval in that role before flipping back
    policy.decide(snap(11, w("p0", P, 0.9), w("d0", D, 0.9), w("d1", P, 0.0)))
    assert policy.decide(snap(20, w("p0", P, 0.9), w("d0", D, 0.9), w("d1", P, 0.0))) == []
    assert policy.decide(snap(21, w("p0", P, 0.9), w("d0", D, 0.9), w("d1", P, 0.0)))[0].to_role is D


# -- slo -----------------------------------------------------------------------------------------------------
def test_slo_flips_capacity_to_the_side_missing_its_objective() -> None:
    policy = SloFlip(SloParams(cooldown_s=30, min_samples=10))
    cluster = (w("p0", P, 1.0), w("d0", D, 0.4), w("d1", D, 0.2))
    orders = policy.decide(snap(0, *cluster, ttft=0.5, tpot=0.99, samples=50))
    assert orders == [FlipOrder("d1", P, orders[0].reason)]  # the least loaded decode worker
    assert "TTFT attainment 50% < 90%" in orders[0].reason
    assert policy.decide(snap(10, *cluster, ttft=0.5, tpot=0.99, samples=50)) == []  # cooldown
    tpot = SloFlip(SloParams(min_samples=10)).decide(
        snap(0, w("p0", P, 0.1), w("p1", P, 0.3), w("d0", D, 1.0), ttft=1.0, tpot=0.7, samples=50)
    )
    assert tpot == [FlipOrder("p0", D, tpot[0].reason)]


def test_slo_does_nothing_without_enough_samples_or_when_both_sides_miss() -> None:
    cluster = (w("p0", P, 1.0), w("d0", D, 0.4), w("d1", D, 0.2))
    assert SloFlip(SloParams(min_samples=20)).decide(snap(0, *cluster, ttft=0.1, tpot=1.0, samples=19)) == []
    # decode misses too: taking a decode worker would only move the miss
    assert SloFlip(SloParams(min_samples=1)).decide(snap(0, *cluster, ttft=0.1, tpot=0.5, samples=50)) == []


def test_slo_respects_min_and_max_per_role() -> None:
    cluster = (w("p0", P, 1.0), w("p1", P, 1.0), w("d0", D, 0.4), w("d1", D, 0.2))
    capped = SloFlip(SloParams(min_samples=1, max_prefill=2))
    assert capped.decide(snap(0, *cluster, ttft=0.2, tpot=1.0, samples=50)) == []
    floor = SloFlip(SloParams(min_samples=1, min_decode=2))
    assert floor.decide(snap(0, *cluster, ttft=0.2, tpot=1.0, samples=50)) == []


def test_slo_adds_workers_below_max_workers_instead_of_flipping() -> None:
    policy = SloFlip(SloParams(min_samples=1, cooldown_s=0))
    cluster = (w("p0", P, 1.0), w("d0", D, 0.4), w("d1", D, 0.2))
    orders = policy.decide(snap(0, *cluster, ttft=0.3, tpot=1.0, samples=50, max_workers=4))
    assert orders == [ScaleOrder(P, orders[0].reason)] and "3 of at most 4" in orders[0].reason
    starting = (*cluster, w("p1", P, 0.0, Lifecycle.STARTING))
    assert policy.decide(snap(1, *starting, ttft=0.3, tpot=1.0, samples=50, max_workers=4)) == []  # settling
    full = (*cluster, w("p1", P, 1.0))  # the new worker is up, TTFT still misses: at max_workers, flip instead
    orders = policy.decide(snap(2, *full, ttft=0.3, tpot=1.0, samples=50, max_workers=4))
    assert orders == [FlipOrder("d1", P, orders[0].reason)]


def test_slo_removes_a_long_idle_worker_above_the_base_count() -> None:
    policy = SloFlip(SloParams(min_samples=1, cooldown_s=0, base_workers=2, idle_s=60))
    cluster = (w("p0", P, 0.5), w("d0", D, 0.5), w("d1", D, 0.0))
    assert policy.decide(snap(0, *cluster, ttft=1.0, tpot=1.0, samples=50, max_workers=4)) == []
    orders = policy.decide(snap(60, *cluster, ttft=1.0, tpot=1.0, samples=50, max_workers=4))
    assert orders == [RemoveOrder("d1", orders[0].reason)]
    at_base = SloFlip(SloParams(min_samples=1, cooldown_s=0, base_workers=3, idle_s=60))
    for t in (0, 100):
        kept = at_base.decide(snap(t, *cluster, ttft=1.0, tpot=1.0, samples=50, max_workers=4))
    assert kept == []
    no_autoscale = SloFlip(SloParams(min_samples=1, cooldown_s=0, base_workers=1, idle_s=60))
    for t in (0, 100):
        kept = no_autoscale.decide(snap(t, *cluster, ttft=1.0, tpot=1.0, samples=50, max_workers=0))
    assert kept == []


def test_slo_takes_no_worker_its_side_is_using() -> None:
    busy = (w("p0", P, 1.0), w("d0", D, 0.9), w("d1", D, 0.7))  # decode meets TPOT, but both workers work
    assert SloFlip(SloParams(min_samples=1)).decide(snap(0, *busy, ttft=0.2, tpot=1.0, samples=50)) == []
    with pytest.raises(ValueError, match="donor_max_load"):
        SloParams(donor_max_load=0)


def test_the_slo_window_counts_only_requests_with_an_objective() -> None:
    from tetriserve.control_plane.flip.window import SloWindow

    window = SloWindow(60.0, tpot_slo_ms=20.0)
    window.observe(0.0, ttft_ms=100.0, tpot_ms=None)  # one output token: no TPOT to judge, no TTFT objective
    window.observe(1.0, ttft_ms=900.0, tpot_ms=10.0, ttft_slo_ms=500.0)  # its own TTFT objective, missed
    window.observe(2.0, ttft_ms=100.0, tpot_ms=30.0)
    got = window.attainment(now=3.0)
    assert (got.ttft, got.tpot, got.samples) == (0.0, 0.5, 2)
    assert window.attainment(now=61.5).samples == 1  # the first two have left the window
