"""Load reports: a worker sends its load when it changed, else once a heartbeat (no Ray)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad, PrefillLoad, same_load
from tetriserve.engine.worker_base import EngineWorker


def _decode(free: int = 10, at: float = 0.0, steps: int = 0, running: int = 0, **fields: Any) -> DecodeLoad:
    return DecodeLoad("decode-0", free, 10, 32, running, 0, 0, 0, at, steps=steps, **fields)


def test_same_load_ignores_when_it_was_taken_and_the_step_counter_only() -> None:
    assert same_load(_decode(at=1.0, steps=3), _decode(at=2.0, steps=9))
    assert not same_load(_decode(free=10), _decode(free=9))
    assert not same_load(_decode(), None) and not same_load(None, None)
    assert not same_load(_decode(), PrefillLoad("decode-0", 0, 0, 0, 0.0))


def test_within_the_deadband_a_quantity_that_drifts_is_no_change_but_a_state_always_is() -> None:
    steady = _decode(free=100, running=40, remaining_tokens=10_000, step_s=0.02)
    drifted = _decode(free=95, running=37, remaining_tokens=9_200, step_s=0.03)  # each < 10% of its value
    assert same_load(steady, drifted, 0.1)
    assert not same_load(steady, drifted)  # no deadband: every move is a change
    assert not same_load(steady, _decode(free=89, running=40, remaining_tokens=10_000), 0.1)  # 11% fewer free
    assert not same_load(_decode(running=0), _decode(running=1), 0.1)  # from or to zero: always a change
    assert not same_load(steady, replace(steady, accepting=False), 0.9)  # a state is never within a band
    assert not same_load(steady, replace(steady, slice_iters=8), 0.9)
    prefill = PrefillLoad("prefill-0", 10, 1, 4000, 0.0, queue_wait_s=2.0, seconds_per_token=1e-4)
    assert same_load(prefill, replace(prefill, queued=11, queued_prompt_tokens=4200, seconds_per_token=2e-4), 0.1)
    assert not same_load(prefill, replace(prefill, queue_wait_s=2.5), 0.1)


class _Monitor:
    def report(self, load: Any) -> None:
        return None


def _worker(**config: Any) -> tuple[EngineWorker, FakeHandle]:
    worker = EngineWorker.__new__(EngineWorker)  # no engine, no endpoint: only the report bookkeeping
    worker.config = ClusterConfig(**config)
    worker._reported, worker._reported_at = None, 0.0
    monitor = FakeHandle(_Monitor())
    worker._monitor = monitor
    return worker, monitor


def test_a_worker_reports_a_change_at_once_and_an_unchanged_load_once_a_heartbeat() -> None:
    worker, monitor = _worker(report_interval_ms=100, heartbeat_interval_ms=1000, report_tolerance=0)
    sent = lambda: len(monitor.called("report"))  # noqa: E731
    worker._report(_decode(), now=10.0)
    assert sent() == 1
    for tick in range(1, 10):  # 0.9 s of an unchanged load (the engine stepping is no change)
        worker._report(_decode(at=tick, steps=tick), now=10.0 + tick / 10)
    assert sent() == 1
    worker._report(_decode(free=9), now=10.95)  # changed: goes now
    assert sent() == 2
    worker._report(_decode(free=9, steps=50), now=11.95)  # a heartbeat after an unchanged second
    assert sent() == 3


def test_a_load_drifting_by_less_than_the_deadband_at_each_look_goes_out_once_it_has_drifted_past_it() -> None:
    worker, monitor = _worker(report_interval_ms=100, heartbeat_interval_ms=1000, report_tolerance=0.1)
    sent = lambda: len(monitor.called("report"))  # noqa: E731
    worker._report(_decode(remaining_tokens=1000), now=10.0)
    for tick in range(1, 5):  # 3% fewer tokens left at each look: 9.9% off the last report after three
        worker._report(_decode(remaining_tokens=1000 - 33 * tick), now=10.0 + tick / 10)
        assert sent() == (1 if tick < 4 else 2)
    worker._report(_decode(remaining_tokens=860), now=11.35)  # within the band of the last report (868)
    assert sent() == 2
    worker._report(_decode(remaining_tokens=860), now=11.45)  # but a heartbeat is due
    assert sent() == 3


def test_the_heartbeat_must_come_often_enough_for_a_live_worker_never_to_look_dead() -> None:
    import pytest

    with pytest.raises(ValueError, match="heartbeat_interval_ms"):
        ClusterConfig(report_interval_ms=100, heartbeat_interval_ms=50)
    with pytest.raises(ValueError, match="dead_after_s"):
        ClusterConfig(heartbeat_interval_ms=4000, dead_after_s=10)
