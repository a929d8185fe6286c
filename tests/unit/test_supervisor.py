"""The supervisor's bookkeeping without Ray: deaths, health, restarts with backoff, stale news ignored."""

from __future__ import annotations

import pytest

from tetriserve.control_plane.supervisor import ActorState, Supervisor


def _sup() -> Supervisor:
    sup = Supervisor([("decode-0", "decode"), ("global-scheduler", "scheduler")], dead_after_s=10.0, backoff_s=0.5)
    sup.health("decode-0", 0, "serving", 0.0)
    return sup


def test_a_death_restarts_at_once_as_the_next_incarnation_and_active_once_serving() -> None:
    sup = _sup()
    assert sup.slots["decode-0"].state is ActorState.ACTIVE
    assert sup.died("decode-0", 0, 100.0, "ActorDiedError")
    assert not sup.died("decode-0", 0, 100.1, "ActorDiedError")  # told twice: news once
    (slot,) = sup.due(100.0)
    assert (slot.name, slot.incarnation, slot.restarts, slot.state) == ("decode-0", 1, 1, ActorState.RESTARTING)
    assert sup.due(100.0) == []
    sup.started("decode-0", 1, 120.0)
    assert sup.slots["decode-0"].state is ActorState.STARTING
    sup.health("decode-0", 0, "serving", 121.0)  # about the old life: ignored
    assert sup.slots["decode-0"].state is ActorState.STARTING
    sup.health("decode-0", 1, "serving", 121.0)
    assert sup.slots["decode-0"].state is ActorState.ACTIVE
    assert not sup.died("decode-0", 0, 122.0, "late notice of the old life")


def test_a_control_plane_actor_is_active_as_soon_as_it_is_built() -> None:
    sup = _sup()
    sup.health("global-scheduler", 0, "serving", 0.0)
    sup.died("global-scheduler", 0, 5.0, "killed")
    (slot,) = sup.due(5.0)
    sup.started(slot.name, slot.incarnation, 6.0)
    assert sup.slots["global-scheduler"].state is ActorState.ACTIVE


def test_unhealthy_for_dead_after_s_means_kill_and_a_good_report_in_between_resets_the_clock() -> None:
    sup = _sup()
    assert not sup.health("decode-0", 0, "stuck", 0.0)
    assert not sup.health("decode-0", 0, "stuck", 9.0)
    assert not sup.health("decode-0", 0, "serving", 9.5)
    assert not sup.health("decode-0", 0, "stale", 10.0)
    assert not sup.health("decode-0", 0, "stale", 19.0)
    assert sup.health("decode-0", 0, "stale", 20.0)


def test_a_life_that_dies_young_waits_longer_each_time_and_a_failed_start_counts_as_a_death() -> None:
    sup = _sup()
    sup.died("decode-0", 0, 0.0, "x")
    (slot,) = sup.due(0.0)
    sup.start_failed("decode-0", slot.incarnation, 1.0, "name taken")
    assert sup.due(1.2) == []  # backoff 0.5 s
    (slot,) = sup.due(1.5)
    sup.started("decode-0", slot.incarnation, 2.0)
    sup.health("decode-0", slot.incarnation, "serving", 2.0)
    sup.died("decode-0", slot.incarnation, 3.0, "again")  # died young: waits 1 s
    assert sup.due(3.9) == []
    (slot,) = sup.due(4.0)
    assert slot.incarnation == 3 and slot.restarts == 3
    sup.started("decode-0", 3, 4.0)
    sup.health("decode-0", 3, "serving", 4.0)
    sup.died("decode-0", 3, 100.0, "after a long stable life")  # stable: at once again
    assert [s.incarnation for s in sup.due(100.0)] == [4]


def test_an_added_worker_is_built_at_once_as_life_0_and_is_no_restart() -> None:
    sup = _sup()
    sup.add("decode-1", "decode", now=5.0)
    (slot,) = sup.due(5.0)
    assert (slot.name, slot.incarnation, slot.restarts, slot.state) == ("decode-1", 0, 0, ActorState.RESTARTING)
    sup.started("decode-1", 0, 6.0)
    sup.health("decode-1", 0, "serving", 7.0)
    assert sup.slots["decode-1"].state is ActorState.ACTIVE
    with pytest.raises(ValueError, match="exists already"):
        sup.add("decode-1", "decode", now=8.0)


def test_a_flipped_worker_keeps_its_life_and_a_later_life_is_built_in_its_new_role() -> None:
    sup = _sup()
    slot = sup.relabel("decode-0", "prefill")
    assert (slot.role, slot.incarnation, slot.restarts, slot.state) == ("prefill", 0, 0, ActorState.ACTIVE)
    assert sup.died("decode-0", 0, 10.0, "killed")
    (slot,) = sup.due(20.0)
    assert (slot.role, slot.incarnation, slot.restarts) == ("prefill", 1, 1)
    with pytest.raises(ValueError, match="no actor"):
        sup.relabel("decode-9", "prefill")


def test_a_removed_worker_is_never_re_created() -> None:
    sup = _sup()
    assert sup.remove("decode-0") is not None
    assert not sup.died("decode-0", 0, 1.0, "killed for good")
    assert sup.due(100.0) == [] and "decode-0" not in sup.slots
