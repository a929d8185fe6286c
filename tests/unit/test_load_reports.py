"""Load reports: a worker sends its load when it changed, else once a heartbeat (no Ray)."""

from __future__ import annotations

from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad, PrefillLoad, same_load
from tetriserve.engine.worker_base import EngineWorker


def _decode(free: int = 10, at: float = 0.0, steps: int = 0) -> DecodeLoad:
    return DecodeLoad("decode-0", free, 10, 32, 0, 0, 0, 0, at, steps=steps)


def test_same_load_ignores_when_it_was_taken_and_the_step_counter_only() -> None:
    assert same_load(_decode(at=1.0, steps=3), _decode(at=2.0, steps=9))
    assert not same_load(_decode(free=10), _decode(free=9))
    assert not same_load(_decode(), None) and not same_load(None, None)
    assert not same_load(_decode(), PrefillLoad("decode-0", 0, 0, 0, 0.0))


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
    worker, monitor = _worker(report_interval_ms=100, heartbeat_interval_ms=1000)
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


def test_the_heartbeat_must_come_often_enough_for_a_live_worker_never_to_look_dead() -> None:
    import pytest

    with pytest.raises(ValueError, match="heartbeat_interval_ms"):
        ClusterConfig(report_interval_ms=100, heartbeat_interval_ms=50)
    with pytest.raises(ValueError, match="dead_after_s"):
        ClusterConfig(heartbeat_interval_ms=4000, dead_after_s=10)
