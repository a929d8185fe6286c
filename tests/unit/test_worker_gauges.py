"""The workers' role, lifecycle and flip gauges the Ray dashboard shows, from the controller's views (no Ray)."""

from __future__ import annotations

import pytest

from tetriserve.common.lifecycle import FlipTiming, Lifecycle, LifecycleView
from tetriserve.common.load import Role
from tetriserve.observability.worker_gauges import gauge_values


def _view(wid: str, role: Role, state: Lifecycle, flips: int = 0, last: FlipTiming | None = None) -> LifecycleView:
    return LifecycleView(wid, role, state, flips, None, False, last)


def test_one_set_of_gauges_per_worker_with_its_role_state_flips_and_last_flip() -> None:
    flipped = FlipTiming(Role.DECODE, Role.PREFILL, 1.5, 0.25, 1.9, 0.0008)
    views = {
        "decode-1": _view("decode-1", Role.PREFILL, Lifecycle.ACTIVE, 1, flipped),
        "decode-0": _view("decode-0", Role.DECODE, Lifecycle.DRAINING),
        "decode-9": _view("decode-9", Role.DECODE, Lifecycle.DEAD),  # removed: no gauges
    }
    got = {(v.name, v.tags): v.value for v in gauge_values(views, {"decode-1": 0, "decode-0": 2})}
    assert got[("role", (("worker", "decode-1"), ("role", "prefill")))] == 1.0
    assert got[("role", (("worker", "decode-1"), ("role", "decode")))] == 0.0
    assert got[("lifecycle", (("worker", "decode-0"), ("state", "draining")))] == 1.0
    assert got[("lifecycle", (("worker", "decode-0"), ("state", "active")))] == 0.0
    assert got[("flips", (("worker", "decode-1"),))] == 1.0
    assert got[("lives", (("worker", "decode-0"),))] == 2.0
    spans = {dict(tags)["span"]: value for (name, tags), value in got.items() if name == "last_flip_ms"}
    assert spans == pytest.approx({"drain": 1500.0, "switch": 250.0, "swap": 0.8, "order_to_served": 1900.0})
    assert not any(dict(tags)["worker"] == "decode-9" for _, tags in got)
