"""The elastic controller (control_plane/elastic.py) over a fake actuator and hand-built monitor snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from tetriserve.common.flip_config import FlipConfig, ScaleConfig
from tetriserve.common.lifecycle import Lifecycle
from tetriserve.common.load import Role
from tetriserve.control_plane.elastic import MIN_DRAIN_S, Elastic
from tetriserve.control_plane.flip import make_flip_policy, policy_from_config
from tetriserve.control_plane.flip.window import SloWindow

P, D = Role.PREFILL, Role.DECODE


class FakeActuator:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def drain(self, worker_id: str, draining: bool) -> None:
        self.calls.append(("drain", worker_id, draining))

    def add_worker(self, name: str, role: str, now: float) -> None:
        self.calls.append(("add", name, role))

    def flip(self, name: str, role: str, now: float) -> None:
        self.calls.append(("flip", name, role))

    def remove_worker(self, name: str) -> None:
        self.calls.append(("remove", name))


def member(
    wid: str, role: Role, state: str = "serving", inc: int = 0, queued: int = 0, running: int = 0
) -> dict[str, Any]:
    return {
        "worker_id": wid,
        "role": role.value,
        "state": state,
        "incarnation": inc,
        "load": {"queued": queued, "running": running, "free_kv_blocks": 90.0, "total_kv_blocks": 100.0},
    }


def controller(policy: str = "off", **flip: Any) -> tuple[Elastic, FakeActuator]:
    act = FakeActuator()
    cfg = FlipConfig(policy=policy, **flip)
    return Elastic(cfg, ScaleConfig(), act, policy_from_config(cfg)), act


def test_a_flip_drains_waits_for_the_requests_then_switches_the_role_in_place() -> None:
    el, act = controller()
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, running=2)], now=0.0)
    assert el.flip("decode-1", P, now=1.0) == "draining decode-1 to flip it to prefill"
    assert act.calls == [("drain", "decode-1", True)]
    assert el.lifecycles()["decode-1"].state is Lifecycle.DRAINING
    busy = [member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining", running=1)]
    for t in (2.0, 3.0, 10.0):
        el.tick(busy, now=t)
    assert el.lifecycles()["decode-1"].state is Lifecycle.DRAINING  # its request still runs there
    idle = [member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining")]
    el.tick(idle, now=11.0)
    el.tick(idle, now=11.6)
    assert act.calls[-1] == ("flip", "decode-1", "prefill")
    assert el.lifecycles()["decode-1"].state is Lifecycle.FLIPPING
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining")], now=12.0)
    el.flipped("decode-1", 0.004)  # the worker swapped its role; the monitor has not heard yet
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", P, "starting")], now=13.0)
    assert el.lifecycles()["decode-1"].state is Lifecycle.FLIPPING
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", P)], now=14.0)
    view = el.lifecycles()["decode-1"]
    assert (view.role, view.state, view.flips) == (P, Lifecycle.ACTIVE, 1)
    assert view.last_flip is not None and view.last_flip.drain_s == pytest.approx(10.6)
    assert view.last_flip.switch_s == pytest.approx(2.4)
    assert view.last_flip.engine_switch_s == pytest.approx(0.004)
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", P, running=1)], now=15.0)
    assert el.lifecycles()["decode-1"].last_flip.first_served_s == pytest.approx(14.0)
    assert [d.outcome.split(" ")[0] for d in el.decisions] == ["started", "switching", "done"]
    assert "on the engine 4.0 ms" in el.decisions[-1].outcome


def test_a_request_served_between_two_snapshots_counts_as_the_first_in_the_new_role() -> None:
    el, _ = controller()

    def snap(role: Role, state: str = "serving", steps: int = 0) -> list[dict[str, Any]]:
        flipped = member("decode-1", role, state)
        flipped["load"]["steps"] = steps
        return [member("prefill-0", P), member("decode-0", D), flipped]

    el.tick(snap(D, steps=40), now=0.0)
    el.flip("decode-1", P, now=0.0)
    for t in (1.0, 1.6):
        el.tick(snap(D, "draining", steps=40), now=t)
    el.tick(snap(P, steps=40), now=2.0)  # serving in its new role, nothing served yet
    assert el.lifecycles()["decode-1"].last_flip.first_served_s is None
    el.tick(snap(P, steps=43), now=2.5)  # never seen busy, but its engine stepped: a short request came and went
    assert el.lifecycles()["decode-1"].last_flip.first_served_s == pytest.approx(2.5)


def test_a_flip_the_worker_cannot_carry_out_leaves_it_serving_in_its_old_role() -> None:
    el, act = controller()
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D)], now=0.0)
    el.flip("decode-1", P, now=0.0)
    idle = [member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining")]
    el.tick(idle, now=1.0)
    el.tick(idle, now=1.6)
    assert el.lifecycles()["decode-1"].state is Lifecycle.FLIPPING
    el.flip_failed("decode-1", 2.0, "TimeoutError: still busy")
    view = el.lifecycles()["decode-1"]
    assert (view.role, view.state, view.flips) == (D, Lifecycle.ACTIVE, 0)
    assert act.calls[-1] == ("drain", "decode-1", False)  # placeable again
    assert el.decisions[-1].outcome.startswith("failed")
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D)], now=2.5)
    assert el.flip("decode-1", P, now=3.0)  # and may be flipped again


def test_a_drain_waits_at_least_the_settling_time_and_gives_up_at_the_timeout() -> None:
    el, act = controller(drain_timeout_s=30)
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D)], now=0.0)
    el.flip("decode-1", P, now=0.0)
    idle = [member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining")]
    el.tick(idle, now=0.1)
    el.tick(idle, now=0.7)
    assert act.calls[-1][0] == "drain"  # idle for 0.6 s, but a dispatch may still be landing
    el.tick(idle, now=MIN_DRAIN_S)
    assert act.calls[-1] == ("flip", "decode-1", "prefill")
    stuck, act2 = controller(drain_timeout_s=30)
    stuck.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, running=3)], now=0.0)
    stuck.flip("decode-1", P, now=0.0)
    stuck.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining", running=3)], now=29.0)
    assert act2.calls[-1][0] == "drain"
    stuck.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining", running=3)], now=30.0)
    assert act2.calls[-1] == ("flip", "decode-1", "prefill")
    assert "timed out" in stuck.decisions[-1].reason


def test_orders_that_cannot_be_carried_out_are_refused_by_name() -> None:
    el, _ = controller()
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D, "stale")], now=0.0)
    with pytest.raises(LookupError, match="unknown worker 'decode-9'"):
        el.flip("decode-9", P, now=1)
    with pytest.raises(ValueError, match="decode worker already"):
        el.flip("decode-0", D, now=1)
    with pytest.raises(ValueError, match="at least 1 prefill worker"):
        el.flip("prefill-0", D, now=1)
    with pytest.raises(ValueError, match="decode-1 is not serving"):
        el.flip("decode-1", P, now=1)
    with pytest.raises(ValueError, match="--decode 0: at least 1"):
        el.scale({D: 0}, now=1)
    el.tick([member("prefill-0", P), member("decode-0", D), member("decode-1", D)], now=2.0)
    el.flip("decode-1", P, now=2)
    with pytest.raises(ValueError, match="decode-1 is busy: flip decode-1 prefill"):
        el.flip("decode-1", P, now=3)


def test_scale_adds_new_names_and_drains_the_least_loaded_to_remove() -> None:
    el, act = controller()
    members = [member("prefill-0", P), member("decode-0", D, running=5), member("decode-1", D)]
    el.tick(members, now=0.0)
    said = el.scale({P: 2, D: 1}, now=1.0)
    assert said == ["adding prefill-1", "draining decode-1 to remove it"]
    assert ("add", "prefill-1", "prefill") in act.calls and ("drain", "decode-1", True) in act.calls
    assert el.scale({P: 2, D: 1}, now=1.5) == ["nothing to do: the counts are already so"]
    members = [
        member("prefill-0", P),
        member("prefill-1", P, "starting"),
        member("decode-0", D, running=5),
        member("decode-1", D, "draining"),
    ]
    el.tick(members, now=2.0)
    el.tick(members, now=2.6)
    assert act.calls[-1] == ("remove", "decode-1") and "decode-1" not in el.lifecycles()
    assert el.lifecycles()["prefill-1"].state is Lifecycle.STARTING
    el.tick([member("prefill-0", P), member("prefill-1", P), member("decode-0", D)], now=20.0)
    assert el.lifecycles()["prefill-1"].state is Lifecycle.ACTIVE
    assert [d.order for d in el.decisions] == ["add prefill-1", "remove decode-1", "remove decode-1", "add prefill-1"]
    el.scale({D: 2}, now=21.0)
    assert act.calls[-1] == ("add", "decode-2", "decode")  # a removed worker's name is never used again


def test_the_tetriinfer_policy_flips_an_idle_worker_by_itself() -> None:
    el, act = controller("tetriinfer", interval_s=5, load_window_s=0.5, check_interval_s=0.25)
    busy_prefill = [
        member("prefill-0", P, queued=4, running=1),
        member("decode-0", D, running=6),
        member("decode-1", D),
    ]
    t = 0.0
    while t < 8 and not any(c[0] == "drain" for c in act.calls):
        el.tick(busy_prefill, now=t)
        t += 0.25
    assert ("drain", "decode-1", True) in act.calls
    assert el.decisions[-1].source == "policy:tetriinfer" and "load under 10%" in el.decisions[-1].reason


def test_the_slo_policy_adds_a_prefill_worker_when_ttft_misses() -> None:
    act = FakeActuator()
    window = SloWindow(60.0, ttft_slo_ms=100.0)
    el = Elastic(
        FlipConfig(min_samples=5, check_interval_s=0.1),
        ScaleConfig(max_workers=4),
        act,
        make_flip_policy("slo", min_samples=5, cooldown_s=0),
        window,
    )
    for i in range(10):
        window.observe(now=float(i) / 10, ttft_ms=500.0, tpot_ms=5.0)
    el.tick([member("prefill-0", P, queued=9), member("decode-0", D)], now=1.0)
    assert act.calls == [("add", "prefill-1", "prefill")]
    assert "TTFT attainment 0% < 90%" in el.decisions[-1].reason


def test_a_removed_worker_listed_by_a_stale_snapshot_does_not_come_back() -> None:
    el, act = controller()
    members = [member("prefill-0", P), member("decode-0", D), member("decode-1", D)]
    el.tick(members, now=0.0)
    el.scale({D: 1}, now=0.0)
    drained = [member("prefill-0", P), member("decode-0", D), member("decode-1", D, "draining")]
    el.tick(drained, now=0.5)
    el.tick(drained, now=1.5)
    assert act.calls[-1][0] == "remove"
    el.tick(drained, now=2.0)  # taken before the monitor forgot it
    assert sorted(el.lifecycles()) == ["decode-0", "prefill-0"]
