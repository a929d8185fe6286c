"""Admission bounded per worker: the prefill pace and queue wait a worker reports, and the
GlobalScheduler placing only where the wait is within the bound (the refusal's way to the clients:
test_gateway_limits.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.common.load import PrefillLoad, same_load
from tetriserve.common.stream import PlacementRequest
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.engine.stats import EngineStats
from tetriserve.prefill_worker.pace import PrefillPace


def _observe(pace: PrefillPace, prompt_tokens: int, step_s: float, cached: int = 0, backlogged: bool = True) -> None:
    """The engine has gone through ``prompt_tokens`` prompt tokens (``cached`` of them held by its prefix cache)
    in ``step_s`` seconds of steps so far; prompts wait for it now if ``backlogged``."""
    stats = EngineStats(prompt_tokens_cached=cached, step_seconds=step_s)
    pace.observe(stats, computed_tokens=prompt_tokens - cached, backlogged=backlogged)


def test_pace_is_measured_from_prompt_tokens_and_stepping_time_and_prices_the_queue() -> None:
    pace = PrefillPace()
    _observe(pace, 0, 10.0)  # the engine's seconds spent stepping so far, not the clock
    assert pace.seconds_per_token == 0.0 and pace.queue_wait_s([100], None, None) == 0.0  # not measured yet
    _observe(pace, 1000, 11.0)  # 1000 tokens in 1 s of steps
    assert pace.seconds_per_token == pytest.approx(1e-3)
    _observe(pace, 1000, 11.0)  # an idle interval: no steps, no sample
    assert pace.seconds_per_token == pytest.approx(1e-3)
    _observe(pace, 1500, 12.0)  # 500 tokens in 1 s of steps: the pace moves toward it
    assert 1e-3 < pace.seconds_per_token < 2e-3
    assert pace.queue_wait_s([100, 300], None, None) == pytest.approx(400 * pace.seconds_per_token)


def test_prompts_the_prefix_cache_held_do_not_make_the_queue_look_slow() -> None:
    """The queue's prompts are priced whole, so the pace counts prompt tokens whole: 50 prompts of 1000 tokens
    that the cache held but for 10 tokens each, in 0.5 s of steps, are 1e-5 s a prompt token, not 1e-3 s a
    computed one (which would price the next burst of new prompts 100 times too slow, and refuse it)."""
    pace = PrefillPace()
    _observe(pace, 0, 0.0)
    _observe(pace, 50_000, 0.5, cached=49_500)
    assert pace.seconds_per_token == pytest.approx(1e-5)
    assert pace.queue_wait_s([1000] * 100, None, None) == pytest.approx(1.0)


def test_tokens_counted_after_their_steps_do_not_spike_the_pace() -> None:
    """An interval of 72 ms of steps whose tokens are counted in a later one (11 tokens in it) is not 6.5 ms a
    token: the pace is a ratio of sums, not an average of each interval's ratio. Tokens counted as their prompt's
    prefill ends (as cached tokens are) lag their steps; on a served worker's report intervals the average of each
    interval's ratio reaches 2.1 ms a token where the whole run's pace is 0.105 ms
    (`python benchmarks/diagnostics/prefill_pace_replay.py`)."""
    pace = PrefillPace()
    _observe(pace, 0, 0.0)
    tokens, steps = 0, 0.0
    for _ in range(20):  # 1000 tokens per 0.1 s of steps
        tokens, steps = tokens + 1000, steps + 0.1
        _observe(pace, tokens, steps)
    assert pace.seconds_per_token == pytest.approx(1e-4)
    tokens, steps = tokens + 11, steps + 0.072  # the lump
    _observe(pace, tokens, steps)
    assert pace.seconds_per_token < 1.5e-4
    tokens, steps = tokens + 709, steps + 0.0  # the chunked prompts end: their steps were counted already
    _observe(pace, tokens, steps)
    assert pace.seconds_per_token == pytest.approx(1e-4, rel=0.05)


def test_steps_before_their_tokens_are_counted_count_with_them() -> None:
    pace = PrefillPace()
    _observe(pace, 0, 0.0)
    _observe(pace, 0, 0.6)  # no token counted yet: nothing to price with
    assert pace.seconds_per_token == 0.0
    _observe(pace, 6000, 0.6)  # now they are (the 6000 tokens took those 0.6 s)
    assert pace.seconds_per_token == pytest.approx(1e-4, rel=0.01)


def test_computed_tokens_count_as_they_are_scheduled_and_cached_ones_as_their_prompts_end() -> None:
    """Counted only as their prompts end, computed tokens lag a burst's steps and the pace reads low when the
    burst is placed: after a smoke test, 455 of a 600-prompt burst are refused where the last served prompt's
    first token comes at 15 s (`python benchmarks/diagnostics/prefill_pace_probe.py --warmup smoke --num-prompts
    600 --rounds 1`, measured on a46ce67 with the pace set by a backlog's steps only and tokens counted as their
    prompts end)."""
    pace = PrefillPace()
    _observe(pace, 0, 0.0)
    _observe(pace, 6000, 0.6)  # computed as scheduled: no prompt has ended yet
    assert pace.seconds_per_token == pytest.approx(1e-4)
    _observe(pace, 12_000, 0.6, cached=6000)  # the prompts end: the cached tokens count now
    assert pace.seconds_per_token == pytest.approx(0.5e-4)  # their prompts ended: half of each was cached


def test_only_a_backlog_s_steps_set_the_pace() -> None:
    """A step costs a fixed few milliseconds whatever it carries, and the pace prices backlogs, whose steps are
    full. Set by every step, a fresh service's smoke test (two single prompts) puts it at 1.858 ms a token, and
    the GlobalScheduler refuses 23 of a burst of 200 prompts whose last first token comes at 17.8 s
    (`python benchmarks/diagnostics/prefill_pace_probe.py --warmup smoke --num-prompts 200 --rounds 1 --commit
    a46ce67`, a46ce67 setting the pace by every step). An interval counts when prompts waited at its start."""
    pace = PrefillPace()
    _observe(pace, 0, 0.0, backlogged=False)
    for n in range(1, 200):  # light load: one short prompt at a time, 4 tokens in 25 ms of steps each
        _observe(pace, 4 * n, 0.025 * n, backlogged=False)
    assert pace.seconds_per_token == 0.0 and pace.queue_wait_s([300] * 60, None, None) == 0.0  # not measured
    tokens, steps = 4 * 199, 0.025 * 199
    _observe(pace, tokens, steps)  # a burst arrives: prompts wait from now on
    tokens, steps = tokens + 512, steps + 0.1
    _observe(pace, tokens, steps)  # full steps: 512 tokens in 0.1 s
    assert pace.seconds_per_token == 0.0  # 0.1 s of a backlog's steps: too little to price with yet
    for _ in range(5):
        tokens, steps = tokens + 512, steps + 0.1
        _observe(pace, tokens, steps)
    assert pace.seconds_per_token == pytest.approx(0.1 / 512)
    tokens, steps = tokens + 512, steps + 0.1
    _observe(pace, tokens, steps, backlogged=False)  # that interval began backlogged: counted
    tokens, steps = tokens + 4, steps + 0.5
    _observe(pace, tokens, steps, backlogged=False)  # light load again: its steps leave the pace alone
    assert pace.seconds_per_token == pytest.approx(0.1 / 512)


def _measured(seconds_per_token: float) -> PrefillPace:
    pace = PrefillPace()
    _observe(pace, 0, 0.0)
    _observe(pace, 1000, 1000 * seconds_per_token)
    return pace


def test_a_backlog_decode_workers_take_prompts_from_is_priced_at_the_share_prefilled_here() -> None:
    """The decode worker computes about a third of a saturation burst's prompt tokens; priced at the engine's
    pace alone, the burst looks 31–34 s deep and is partly refused, while its last first token comes at 15–18 s
    (`python benchmarks/diagnostics/prefill_pace_probe.py --rounds 2`, measured on ada26d0, which has no share)."""
    pace = _measured(1e-3)
    assert pace.local_share == 1.0 and pace.queue_seconds_per_token == pytest.approx(1e-3)  # no backlog seen yet
    for offloaded in (False, True, False, False, True, False):  # 1000-token prompts leave a backlogged queue
        pace.left_queue(1000, offloaded)
    assert pace.local_share == pytest.approx(2 / 3, rel=0.05)
    assert pace.queue_seconds_per_token == pytest.approx(1e-3 * pace.local_share)
    assert pace.queue_wait_s([3000], None, None) == pytest.approx(3.0 * pace.local_share)
    assert pace.seconds_per_token == pytest.approx(1e-3)  # the engine's own pace is unchanged


def test_the_share_follows_the_recent_backlogs() -> None:
    pace = _measured(1e-3)
    for _ in range(20):
        pace.left_queue(500, offloaded=True)
    assert pace.local_share == 0.1  # the least it is priced at
    for _ in range(200):  # decode workers full: 100,000 tokens prefilled here, five time constants
        pace.left_queue(500, offloaded=False)
    assert pace.local_share > 0.99


def test_a_cost_model_s_queue_is_scaled_by_the_share_too() -> None:
    class Linear:
        def request_prefill_time(self, computed: int, remaining: int, chunk: int | None) -> float:
            return remaining * 1e-3

    pace = PrefillPace()
    pace.left_queue(1000, offloaded=False)
    pace.left_queue(1000, offloaded=True)
    assert pace.queue_wait_s([2000], Linear(), 256) == pytest.approx(2.0 * pace.local_share)  # type: ignore[arg-type]
    assert 0.45 < pace.local_share < 0.55


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


def test_between_empty_queues_the_worker_running_fewer_requests_is_chosen() -> None:
    async def main() -> None:
        now = time.time()
        # colocated workers with no prompt queued: colocated-0 decodes 6 streams, colocated-1 decodes 2
        busy = PrefillLoad("colocated-0", 0, 6, 0, now)
        light = PrefillLoad("colocated-1", 0, 2, 0, now)
        gs = _scheduler(AdmissionConfig(), busy, light)
        assert (await gs.place(PlacementRequest("a", 10, 8, now))).prefill_worker == "colocated-1"
        # a queued prompt still outweighs the running ones: colocated-1 now has one request in prefill
        assert (await gs.place(PlacementRequest("b", 10, 8, now))).prefill_worker == "colocated-0"

    asyncio.run(main())
