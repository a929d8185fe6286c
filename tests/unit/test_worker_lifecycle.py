"""A worker's lifecycle (common/lifecycle.py): STARTING → ACTIVE → DRAINING → FLIPPING → ACTIVE(new role)."""

from __future__ import annotations

import pytest

from tetriserve.common.lifecycle import FlipTiming, Lifecycle, WorkerLifecycle
from tetriserve.common.load import Role


def test_a_flip_goes_through_every_state_and_records_its_timing() -> None:
    lc = WorkerLifecycle("decode-1", Role.DECODE)
    assert lc.state is Lifecycle.STARTING and not lc.view().placeable
    lc.activate(now=1.0)
    assert lc.view().placeable
    lc.drain(Role.PREFILL, now=10.0)
    view = lc.view()
    assert (view.state, view.target_role, view.placeable) == (Lifecycle.DRAINING, Role.PREFILL, False)
    lc.flipping(now=12.5)
    assert lc.view().state is Lifecycle.FLIPPING and lc.role is Role.DECODE
    lc.activate(now=12.504)
    view = lc.view()
    assert (view.role, view.state, view.flips, view.target_role) == (Role.PREFILL, Lifecycle.ACTIVE, 1, None)
    assert view.last_flip == FlipTiming(Role.DECODE, Role.PREFILL, 2.5, pytest.approx(0.004))
    lc.served(now=13.0)
    assert lc.view().last_flip is not None and lc.view().last_flip.first_served_s == pytest.approx(3.0)
    lc.served(now=20.0)  # only the first request after the flip counts
    assert lc.view().last_flip.first_served_s == pytest.approx(3.0)


def test_transitions_out_of_order_are_refused_by_name() -> None:
    lc = WorkerLifecycle("prefill-0", Role.PREFILL)
    with pytest.raises(ValueError, match="cannot drain while starting"):
        lc.drain(Role.DECODE, now=0)
    lc.activate(now=0)
    with pytest.raises(ValueError, match="cannot flip while active"):
        lc.flipping(now=0)
    with pytest.raises(ValueError, match="already prefill"):
        lc.drain(Role.PREFILL, now=0)
    with pytest.raises(ValueError, match="cannot activate while active"):
        lc.activate(now=0)


def test_a_drain_for_removal_cannot_flip_and_a_drain_can_be_called_off() -> None:
    lc = WorkerLifecycle("decode-0", Role.DECODE, Lifecycle.ACTIVE)
    lc.drain(None, now=0)
    assert lc.view().removing
    with pytest.raises(ValueError, match="no role to flip to"):
        lc.flipping(now=1)
    lc.cancel()
    view = lc.view()
    assert (view.state, view.removing, view.target_role, view.flips) == (Lifecycle.ACTIVE, False, None, 0)
    lc.die()
    assert lc.view().state is Lifecycle.DEAD and not lc.view().placeable
