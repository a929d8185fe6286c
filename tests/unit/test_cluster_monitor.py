"""ClusterMonitor: states by its own clock, stuck engines, lives, the decode directory once per life (no Ray)."""

from __future__ import annotations

from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.common.load import DecodeLoad, PrefillLoad, Role
from tetriserve.control_plane.cluster_monitor import ClusterMonitor


class _Prefill:
    def update_decode_view(self, loads: list[DecodeLoad], addresses: dict[str, str], handles: dict[str, Any]) -> None:
        return None


class _Scheduler:
    def update_prefill_loads(self, loads: list[PrefillLoad]) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _decode_load(wid: str, incarnation: int = 0, steps: int = 0, busy: bool = False) -> DecodeLoad:
    # the worker's own timestamp is far off: liveness must not read it
    return DecodeLoad(wid, 10, 10, 32, 0, 0, 0, 0, 0.0, incarnation=incarnation, steps=steps, busy=busy)


def _monitor() -> tuple[ClusterMonitor, FakeHandle, FakeHandle, Clock]:
    clock = Clock()
    mon = ClusterMonitor(report_interval_ms=100, stale_after=10, stuck_after_s=5.0, clock=clock)
    prefill, sched = FakeHandle(_Prefill()), FakeHandle(_Scheduler())
    mon.scheduler = sched
    mon.register("prefill-0", "prefill", prefill, "p:1")
    mon.register("decode-0", "decode", object(), "d:0")
    mon.register("decode-1", "decode", object(), "d:1")
    return mon, prefill, sched, clock


def _states(mon: ClusterMonitor) -> dict[str, str]:
    return {m["worker_id"]: m["state"] for m in mon.snapshot()}


def test_states_are_judged_by_the_monitors_clock() -> None:
    mon, _, _, clock = _monitor()
    mon.report(_decode_load("decode-1"))
    clock.t += 5.0  # 50 periods of 100 ms without a report from decode-1
    mon.report(_decode_load("decode-0"))
    assert _states(mon) == {"decode-0": "serving", "decode-1": "stale", "prefill-0": "starting"}


def test_an_engine_with_work_whose_step_counter_stands_still_is_stuck() -> None:
    mon, _, _, clock = _monitor()
    for i in range(8):  # reports keep coming (the actor's event loop is fine), the engine does not move
        clock.t += 0.9
        mon.report(_decode_load("decode-0", steps=7, busy=True))
        mon.report(_decode_load("decode-1", steps=i, busy=True))  # this one steps
    assert _states(mon)["decode-0"] == "stuck" and _states(mon)["decode-1"] == "serving"
    mon.report(_decode_load("decode-0", steps=8, busy=True))
    assert _states(mon)["decode-0"] == "serving"


def test_reports_of_a_previous_life_are_dropped_and_a_new_life_is_announced_again() -> None:
    mon, prefill, _, _ = _monitor()
    mon.report(PrefillLoad("prefill-0", 0, 0, 0, 0.0))
    mon.report(_decode_load("decode-0"))
    mon.broadcast_once()
    assert prefill.called("update_decode_view")[0][1] == {"decode-0": "d:0"}
    mon.mark_dead("decode-0", 0)  # broadcasts at once, without it
    assert prefill.called("update_decode_view")[1][0] == []
    mon.register("decode-0", "decode", object(), "d:9", incarnation=1)
    mon.report(_decode_load("decode-0", incarnation=0))  # the old life's last words
    assert _states(mon)["decode-0"] == "starting"
    mon.report(_decode_load("decode-0", incarnation=1))
    mon.broadcast_once()
    assert prefill.called("update_decode_view")[2][1] == {"decode-0": "d:9"}  # the new KV address
    assert [m["incarnation"] for m in mon.snapshot() if m["worker_id"] == "decode-0"] == [1]


def test_a_worker_flipped_in_place_serves_in_its_new_role_once_registered_with_its_first_load() -> None:
    mon, prefill, _, _ = _monitor()
    mon.report(_decode_load("decode-1"))
    mon.report(PrefillLoad("decode-1", 0, 0, 0, 0.0))  # flipped, not yet registered in its new role: dropped
    assert [m["role"] for m in mon.snapshot() if m["worker_id"] == "decode-1"] == ["decode"]
    mon.register("decode-1", "prefill", FakeHandle(_Prefill()), "d:1", load=PrefillLoad("decode-1", 0, 0, 0, 0.0))
    (flipped,) = [m for m in mon.snapshot() if m["worker_id"] == "decode-1"]
    assert (flipped["role"], flipped["state"], flipped["incarnation"]) == ("prefill", "serving", 0)
    mon.report(_decode_load("decode-1"))  # a late report of the old role
    assert [m["role"] for m in mon.snapshot() if m["worker_id"] == "decode-1"] == ["prefill"]
    mon.report(_decode_load("decode-0"))
    mon.report(PrefillLoad("prefill-0", 0, 0, 0, 0.0))
    mon.broadcast_once()
    assert [ld.worker_id for ld in prefill.called("update_decode_view")[-1][0]] == ["decode-0"]  # decode-1 gone


def test_directory_travels_once_loads_every_time_and_stale_workers_are_left_out() -> None:
    mon, prefill, sched, clock = _monitor()
    mon.report(_decode_load("decode-1"))
    clock.t += 5.0
    mon.report(PrefillLoad("prefill-0", 0, 0, 0, 0.0))
    mon.report(_decode_load("decode-0"))
    mon.broadcast_once()
    mon.broadcast_once()
    first, second = prefill.called("update_decode_view")
    assert [ld.worker_id for ld in first[0]] == ["decode-0"] and first[1] == {"decode-0": "d:0"}
    assert [ld.worker_id for ld in second[0]] == ["decode-0"] and second[1] == {} and second[2] == {}
    mon.report(_decode_load("decode-1"))  # decode-1 comes back: only it is new
    mon.broadcast_once()
    third = prefill.called("update_decode_view")[2]
    assert sorted(ld.worker_id for ld in third[0]) == ["decode-0", "decode-1"] and third[1] == {"decode-1": "d:1"}
    assert len(sched.called("update_prefill_loads")) == 3


class _Decode:
    def rebalance(self, order: Any, address: str, handle: Any) -> list[str]:
        return []


def test_slice_round_orders_the_most_loaded_to_give_to_the_least_and_paces_itself_by_eq_12() -> None:
    mon = ClusterMonitor(report_interval_ms=100, slice_lambda=0.5, slice_min_interval_s=0.2)
    handles = {wid: FakeHandle(_Decode()) for wid in ("decode-0", "decode-1")}
    for wid, h in handles.items():
        mon.register(wid, "decode", h, f"{wid}:1")
    now = 0.0
    # 10 ms a token on both: decode-0 holds 8 s of work, decode-1 2 s
    mon.report(DecodeLoad("decode-0", 10, 10, 32, 4, 0, 0, 0, now, True, 800, 0.04, 32))
    mon.report(DecodeLoad("decode-1", 10, 10, 32, 4, 0, 0, 0, now, True, 200, 0.04, 32))
    assert mon.rebalance_once() == 1.0  # λ · min load = 0.5 · 2 s
    ((order, address, handle),) = handles["decode-0"].called("rebalance")
    assert (order.src, order.dst, address, handle) == ("decode-0", "decode-1", "decode-1:1", handles["decode-1"])
    assert not handles["decode-1"].called("rebalance")


def test_no_slice_round_orders_anything_while_no_decode_worker_slices() -> None:
    mon = ClusterMonitor(report_interval_ms=100, slice_min_interval_s=0.2)
    handle = FakeHandle(_Decode())
    mon.register("decode-0", "decode", handle, "d:0")
    mon.register("decode-1", "decode", FakeHandle(_Decode()), "d:1")
    now = 0.0
    mon.report(DecodeLoad("decode-0", 10, 10, 32, 4, 0, 0, 0, now, True, 800, 0.04, 0))
    mon.report(DecodeLoad("decode-1", 10, 10, 32, 0, 0, 0, 0, now, True, 0, 0.0, 0))
    assert mon.rebalance_once() == 0.2 and not handle.called("rebalance")


def test_loads_are_broadcast_when_they_change_or_a_heartbeat_is_due_not_every_period() -> None:
    mon, prefill, sched, clock = _monitor()
    mon.report(PrefillLoad("prefill-0", 0, 0, 0, 0.0))
    mon.report(_decode_load("decode-0"))
    assert mon.broadcast_due()
    mon.broadcast_once()
    clock.t += 0.1
    mon.report(_decode_load("decode-0", steps=5))  # a heartbeat: only the step counter and the time moved
    assert not mon.broadcast_due()
    clock.t += 0.1
    mon.report(DecodeLoad("decode-0", 9, 10, 32, 1, 0, 0, 1, 0.0))  # a request took a block: goes out now
    assert mon.broadcast_due()
    mon.broadcast_once()
    clock.t += 0.5
    mon.report(_decode_load("decode-1"))  # decode-1 starts serving: the serving set changed
    assert mon.broadcast_due()
    mon.broadcast_once()
    assert not mon.broadcast_due()
    clock.t += mon.heartbeat_s  # nothing changed for a heartbeat: broadcast anyway
    assert mon.broadcast_due()
    mon.broadcast_once()
    clock.t += mon.stale_s + 0.1  # everyone went quiet: they turn stale, which is a change
    assert mon.broadcast_due()
    mon.broadcast_once()
    assert len(prefill.called("update_decode_view")) == 4  # the last time prefill-0 was stale itself
    assert len(sched.called("update_prefill_loads")) == 5 and sched.called("update_prefill_loads")[-1] == ([],)


def test_a_worker_is_stale_only_after_three_missed_heartbeats() -> None:
    clock = Clock()
    mon = ClusterMonitor(report_interval_ms=100, stale_after=10, heartbeat_interval_ms=1000, clock=clock)
    mon.register("decode-0", "decode", object(), "d:0")
    mon.report(_decode_load("decode-0"))
    clock.t += 2.9
    assert _states(mon)["decode-0"] == "serving"
    clock.t += 0.2
    assert _states(mon)["decode-0"] == "stale"


def test_a_draining_worker_reports_on_but_leaves_placement_and_dispatch_and_removal_forgets_it() -> None:
    mon, _, _, _ = _monitor()
    for wid in ("decode-0", "decode-1"):
        mon.report(_decode_load(wid))
    assert mon.drain("decode-1") and not mon.drain("decode-9")
    mon.report(_decode_load("decode-1", steps=3))  # its reports still count (its load shows the drain's end)
    assert _states(mon)["decode-1"] == "draining"
    assert [m.worker_id for m in mon._serving(Role.DECODE)] == ["decode-0"]  # the dispatchers' view
    assert mon.drain("decode-1", False)
    assert _states(mon)["decode-1"] == "serving"
    mon.unregister("decode-1")
    assert "decode-1" not in _states(mon)


def test_with_a_deadband_a_load_that_drifted_within_it_is_not_broadcast_before_the_heartbeat() -> None:
    clock = Clock()
    mon = ClusterMonitor(report_interval_ms=100, clock=clock, report_tolerance=0.1)
    mon.scheduler = FakeHandle(_Scheduler())
    mon.register("decode-0", "decode", object(), "d:0")
    mon.report(DecodeLoad("decode-0", 500, 1000, 32, 40, 0, 0, 40, 0.0, remaining_tokens=9000))
    mon.broadcast_once()
    clock.t += 0.1
    mon.report(DecodeLoad("decode-0", 480, 1000, 32, 38, 0, 0, 38, 0.0, remaining_tokens=8700))  # all < 10%
    assert not mon.broadcast_due()
    clock.t += 0.1
    mon.report(DecodeLoad("decode-0", 480, 1000, 32, 38, 0, 0, 38, 0.0, remaining_tokens=8700, accepting=False))
    assert mon.broadcast_due()  # a state is never within the band


def test_colocated_workers_are_placed_on_and_get_no_decode_view() -> None:
    clock = Clock()
    mon = ClusterMonitor(report_interval_ms=100, stale_after=10, stuck_after_s=5.0, clock=clock)
    sched, colocated = FakeHandle(_Scheduler()), FakeHandle(_Prefill())
    mon.scheduler = sched
    mon.register("colocated-0", "colocated", colocated, "c:0")
    mon.register("colocated-1", "colocated", FakeHandle(_Prefill()), "c:1")
    mon.report(PrefillLoad("colocated-0", 2, 3, 40, 0.0))  # a colocated worker reports a PrefillLoad
    mon.report(_decode_load("colocated-1"))  # never a DecodeLoad: dropped
    mon.broadcast_once()
    ((placed,),) = sched.called("update_prefill_loads")
    assert [ld.worker_id for ld in placed] == ["colocated-0"]
    assert colocated.called("update_decode_view") == []
    assert _states(mon) == {"colocated-0": "serving", "colocated-1": "starting"}
