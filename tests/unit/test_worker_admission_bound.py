"""Admission bounded per worker (issue #14): the queue wait a worker reports (its pace: prefill/test_pace.py), and
the GlobalScheduler placing only where the wait is within the bound (the refusal's way to the clients:
test_gateway_limits.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.common.load import PrefillLoad, same_load
from tetriserve.common.stream import PlacementRequest
from tetriserve.control_plane.global_scheduler import GlobalScheduler


def test_a_changed_pace_alone_is_not_a_changed_load() -> None:
    a = PrefillLoad("p", 1, 0, 10, 1.0, queue_wait_s=0.5, seconds_per_token=1e-3)
    assert same_load(a, PrefillLoad("p", 1, 0, 10, 2.0, queue_wait_s=0.5, seconds_per_token=2e-3))
    assert not same_load(a, PrefillLoad("p", 1, 0, 10, 2.0, queue_wait_s=4.0, seconds_per_token=1e-3))


def _scheduler(limits: AdmissionConfig, *loads: PrefillLoad) -> GlobalScheduler:
    gs = GlobalScheduler({ld.worker_id: object() for ld in loads}, limits=limits)
    gs.prefill_loads = {ld.worker_id: ld for ld in loads}
    return gs


def test_a_request_goes_only_to_a_worker_whose_queue_it_would_wait_behind_within_the_bound() -> None:
    async def main() -> None:
        now = time.time()
        slow = PrefillLoad("prefill-0", 40, 1, 40_000, now, queue_wait_s=40.0, seconds_per_token=1e-3)
        fast = PrefillLoad("prefill-1", 5, 1, 5_000, now, queue_wait_s=5.0, seconds_per_token=1e-3)
        gs = _scheduler(AdmissionConfig(max_wait_s=30), slow, fast)
        placed = await gs.place(PlacementRequest("a", 10_000, 8, now))
        assert placed.prefill_worker == "prefill-1"  # the other would keep it waiting 40 s
        # prompts placed after prefill-1's report count toward its wait: 5 s + 10,000 + 20,000 tokens at 1 ms
        assert (await gs.place(PlacementRequest("b", 20_000, 8, now))).prefill_worker == "prefill-1"
        refused = await gs.place(PlacementRequest("c", 10, 8, now))
        assert refused.prefill_worker is None and refused.retry_after_s == 5  # the shortest wait: 35 s
        assert "overloaded" in (refused.error or "") and gs.counts["refused"] == 1
        # a re-placement (its worker was lost) was admitted already: it is never refused
        moved = await gs.place(PlacementRequest("d", 10, 8, now, attempt=1))
        assert moved.prefill_worker is not None

    asyncio.run(main())


def test_the_count_cap_is_a_backstop_when_no_pace_is_known() -> None:
    async def main() -> None:
        now = time.time()
        gs = _scheduler(AdmissionConfig(max_queued_per_worker=2), PrefillLoad("prefill-0", 0, 0, 0, now))
        assert (await gs.place(PlacementRequest("a", 10, 8, now))).prefill_worker == "prefill-0"
        assert (await gs.place(PlacementRequest("b", 10, 8, now))).prefill_worker == "prefill-0"
        assert (await gs.place(PlacementRequest("c", 10, 8, now))).retry_after_s == 1

    asyncio.run(main())


def test_refusals_are_logged_with_each_workers_queue_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        now = time.time()
        full = PrefillLoad("prefill-0", 40, 1, 40_000, now, queue_wait_s=40.0, seconds_per_token=1e-3)
        gs = _scheduler(AdmissionConfig(max_wait_s=30), full)
        with caplog.at_level("WARNING", logger="tetriserve.control_plane.global_scheduler"):
            for i in range(3):
                assert (await gs.place(PlacementRequest(f"r{i}", 10, 8, now))).prefill_worker is None
        warnings = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
        assert len(warnings) == 1 and gs.counts["refused"] == 3  # one line per REFUSAL_LOG_INTERVAL_S
        assert (
            "prefill-0: 0 placed, 40.0 s of queue (reported 40.0 s, 40000 tokens queued, 1.000 ms/token)"
            in (warnings[0])
        )

    asyncio.run(main())
