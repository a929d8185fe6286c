"""The prefill pace (prefill_worker/pace.py): the cost of a queued prompt token when the steps are full, from a fit
of the engine's step times against their sizes, and the queue's expected wait priced with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tetriserve.engine.stats import EngineStats
from tetriserve.prefill_worker.pace import PrefillPace

CHUNK = 512
FIXED_S, PER_TOKEN_S = 5e-3, 1e-4  # the simulated engine: a step costs 5 ms plus 0.1 ms a token
FULL = (FIXED_S + PER_TOKEN_S * CHUNK) / CHUNK  # a token's cost in full steps: 0.1098 ms


class Engine:
    """Cumulative counters as an engine publishes them."""

    def __init__(self) -> None:
        self.stats = EngineStats()

    def step(self, tokens: int, per_token_s: float = PER_TOKEN_S) -> None:
        self.stats = replace(
            self.stats, step_moments=self.stats.step_moments.plus(tokens, FIXED_S + per_token_s * tokens)
        )

    def prefilled(self, tokens: int, cached: int = 0) -> None:
        s = self.stats
        self.stats = replace(
            s,
            prompt_tokens_total=s.prompt_tokens_total + tokens,
            prompt_tokens_computed=s.prompt_tokens_computed + tokens - cached,
        )

    def prompt(self, tokens: int) -> None:
        """A prompt of ``tokens`` prefilled alone, in chunks."""
        for start in range(0, tokens, CHUNK):
            self.step(min(CHUNK, tokens - start))
        self.prefilled(tokens)


def _watching(engine: Engine) -> PrefillPace:
    pace = PrefillPace()
    pace.observe(engine.stats)
    return pace


def test_one_warm_up_prompt_is_not_a_measured_pace() -> None:
    """Session 58: the one short prompt vLLM's benchmark client sends first set the old pace (prompt tokens over
    stepping seconds) at 4.5 times the engine's, and a burst was refused at the bound. One step size cannot tell
    the fixed part of a step from its tokens: the pace stays unmeasured."""
    engine = Engine()
    pace = _watching(engine)
    engine.prompt(24)
    pace.observe(engine.stats)
    assert pace.seconds_per_token(CHUNK) == 0.0
    assert pace.queue_wait_s([240] * 200, None, CHUNK) == 0.0


def test_prompts_of_several_sizes_at_light_load_give_the_full_step_pace() -> None:
    engine = Engine()
    pace = _watching(engine)
    for n in (24, 180, 60, 400, 12, 250, 900, 75):  # one at a time, as a lightly loaded worker sees them
        engine.prompt(n)
        pace.observe(engine.stats)
    assert pace.step_cost == pytest.approx((FIXED_S, PER_TOKEN_S), rel=1e-6)
    assert pace.seconds_per_token(CHUNK) == pytest.approx(FULL)
    ratio = engine.stats.step_moments.y / engine.stats.prompt_tokens_total  # what the old pace said
    assert ratio > 1.1 * FULL
    assert pace.queue_wait_s([100, 300], None, CHUNK) == pytest.approx(400 * FULL)
    assert pace.seconds_per_token(2 * CHUNK) == pytest.approx((FIXED_S + PER_TOKEN_S * 2 * CHUNK) / (2 * CHUNK))


def test_a_burst_of_full_steps_alone_gives_the_pace_by_its_own_ratio() -> None:
    engine = Engine()
    pace = _watching(engine)
    for _ in range(10):
        engine.step(CHUNK)
    engine.prefilled(10 * CHUNK)
    pace.observe(engine.stats)
    assert pace.step_cost is None  # one size: no fit
    assert pace.seconds_per_token(CHUNK) == pytest.approx(FULL)


def test_idle_time_and_intervals_without_steps_change_nothing() -> None:
    engine = Engine()
    pace = _watching(engine)
    for n in (30, 300, 90):
        engine.prompt(n)
    pace.observe(engine.stats)
    before = pace.seconds_per_token(CHUNK)
    pace.observe(engine.stats)
    pace.observe(engine.stats)
    assert pace.seconds_per_token(CHUNK) == before == pytest.approx(FULL)


def test_the_pace_follows_an_engine_that_slows_down() -> None:
    engine = Engine()
    pace = _watching(engine)
    for n in (30, 300, 90, 450):
        engine.prompt(n)
        pace.observe(engine.stats)
    slower = (FIXED_S + 2 * PER_TOKEN_S * CHUNK) / CHUNK
    for _ in range(60):  # ~6.5 s of full steps, twice as costly a token: three time constants
        for _ in range(2):
            engine.step(CHUNK, 2 * PER_TOKEN_S)
        engine.step(CHUNK // 4, 2 * PER_TOKEN_S)
        engine.prefilled(2 * CHUNK + CHUNK // 4)
        pace.observe(engine.stats)
    assert pace.seconds_per_token(CHUNK) == pytest.approx(slower, rel=0.1)


def test_prompts_the_prefix_cache_held_are_priced_at_their_computed_share() -> None:
    """A client sending its prompts again: the cache holds 99% of them. The queue's prompts are priced whole, so
    the pace counts the share of prompt tokens computed (s32: priced per computed token with the steps' fixed cost
    in it, a burst of resent prompts was refused, 56 of 200)."""
    engine = Engine()
    pace = _watching(engine)
    for n in (30, 300, 90, 450):
        engine.prompt(n)
    pace.observe(engine.stats)
    for _ in range(100):  # 100 prompts of 1000 tokens, each with 10 tokens to compute
        engine.step(10)
        engine.prefilled(1000, cached=990)
    pace.observe(engine.stats)
    assert pace.seconds_per_token(CHUNK) < 0.05 * FULL
    assert pace.queue_wait_s([1000] * 100, None, CHUNK) < 0.05 * 100_000 * FULL


def test_a_prompt_counted_when_its_prefill_ends_does_not_move_the_pace() -> None:
    """The engine counts a prompt's tokens when its prefill ends, but its steps when they run: the pace is from
    the steps, so an interval of other prompts' chunks that ends one short prompt is no lump (s48: averaged per
    interval it priced a served worker at 20 times its pace, benchmarks/results/prefill_pace_replay.md)."""
    engine = Engine()
    pace = _watching(engine)
    for n in (30, 300, 90, 450):
        engine.prompt(n)
        pace.observe(engine.stats)
    for _ in range(5):  # chunks of long prompts: no prompt ends
        engine.step(CHUNK)
    engine.prefilled(11)  # a short one that ends among them
    pace.observe(engine.stats)
    assert pace.seconds_per_token(CHUNK) == pytest.approx(FULL, rel=0.02)


def test_steps_whose_size_does_not_matter_are_all_fixed_cost() -> None:
    pace = PrefillPace()
    engine = Engine()
    pace.observe(engine.stats)
    for n in (50, 400, 100, 300):
        engine.stats = replace(engine.stats, step_moments=engine.stats.step_moments.plus(n, 0.02))
    engine.prefilled(850)
    pace.observe(engine.stats)
    assert pace.step_cost == (pytest.approx(0.02), 0.0)
    assert pace.seconds_per_token(CHUNK) == pytest.approx(0.02 / CHUNK)


def test_a_fit_with_no_fixed_cost_goes_through_the_origin() -> None:
    pace = PrefillPace()
    engine = Engine()
    pace.observe(engine.stats)
    for n in (100, 500, 300):  # 0.1 ms a token less 1 ms: a negative fixed part is none
        engine.stats = replace(engine.stats, step_moments=engine.stats.step_moments.plus(n, 1e-4 * n - 1e-3))
    engine.prefilled(900)
    pace.observe(engine.stats)
    a, b = pace.step_cost or (None, None)
    assert a == 0.0 and b == pytest.approx((1e-4 * 350_000 - 1e-3 * 900) / 350_000)
