"""The front door's admission gate: expected wait from the busy start rate, refusals with Retry-After."""

from __future__ import annotations

import pytest

from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.frontdoor.admission import AdmissionGate, Draining, Overloaded


def test_a_cold_gate_takes_min_queue_then_refuses_with_a_retry_after() -> None:
    gate = AdmissionGate(AdmissionConfig(max_wait_s=30, min_queue=4))
    tickets = [gate.admit(0.0) for _ in range(4)]
    with pytest.raises(Overloaded) as refused:
        gate.admit(0.0)
    assert refused.value.retry_after_s >= 1 and "4 requests waiting" in refused.value.message
    assert gate.stats()["refused"] == 1
    tickets[0].start(0.5)
    gate.admit(0.5)  # room again


def test_the_bound_follows_the_measured_busy_rate() -> None:
    gate = AdmissionGate(AdmissionConfig(max_wait_s=10, min_queue=2))
    now = 0.0
    queue = [gate.admit(now), gate.admit(now)]
    for _ in range(40):  # a backlogged service that starts 4 requests per second
        now += 0.25
        ticket = queue.pop(0)
        ticket.start(now)
        ticket.release(now)
        queue.append(gate.admit(now))
    rate = gate.rate
    assert rate is not None and 3.0 < rate < 5.0
    allowed = gate.allowed_queue()
    assert 30 <= allowed <= 50  # ≈ rate x max_wait_s
    while gate.queued < allowed:
        queue.append(gate.admit(now))
    with pytest.raises(Overloaded) as refused:
        gate.admit(now)
    assert 1 <= refused.value.retry_after_s <= 2


def test_an_idle_spell_keeps_the_busy_rate() -> None:
    gate = AdmissionGate(AdmissionConfig(max_wait_s=10, min_queue=1))
    now = 0.0
    for _ in range(20):  # busy: 10 starts per second
        t = gate.admit(now)
        now += 0.1
        t.start(now)
        t.release(now)
    busy = gate.rate
    gate.admit(now + 60).release(now + 60)  # a quiet minute: no queue, no busy time
    assert busy is not None and gate.rate is not None and gate.rate == pytest.approx(busy, rel=0.01)
    assert gate.allowed_queue() >= 90


def test_released_unstarted_tickets_leave_the_queue_and_release_is_idempotent() -> None:
    gate = AdmissionGate(AdmissionConfig(min_queue=1, max_inflight=2))
    t = gate.admit(0.0)
    t.release(1.0)
    t.release(1.0)
    t.start(1.0)
    assert (gate.queued, gate.inflight) == (0, 0)
    a = gate.admit(1.0)
    a.start(1.0)
    b = gate.admit(1.0)
    b.start(1.0)
    with pytest.raises(Overloaded, match="max_inflight 2"):
        gate.admit(1.0)


def test_check_refuses_like_admit_without_taking_a_place() -> None:
    gate = AdmissionGate(AdmissionConfig(min_queue=1))
    gate.check(0.0)
    gate.check(0.0)
    assert (gate.queued, gate.inflight) == (0, 0)
    gate.admit(0.0)
    with pytest.raises(Overloaded):
        gate.check(0.0)
    gate.close()
    with pytest.raises(Draining):
        gate.check(0.0)
    assert gate.stats()["refused"] == 1  # a drain's refusals are not overload
