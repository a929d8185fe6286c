"""How fast a prefill worker gets through a backlog of prompts, and so how long its queue will take (issue #14).

The GlobalScheduler bounds admission per worker by expected wait: a request
goes only to a prefill worker whose queue it would wait behind for at most
``admission.max_wait_s``. The worker reports that wait with its load, and the
GlobalScheduler prices the prompts it placed since the worker's last report with
the pace the worker reports:

    queue_wait_s = Σ over queued prompts of the cost model's Cᵖ(r) (SOLA eq. 3, online-corrected), when a
                   cost profile is loaded; else queued prompt tokens × seconds_per_token
    seconds_per_token = computed share × (a + b·C) / C, the cost of a prompt token when the steps are full (a queue
                   is a backlog, and a backlog fills the steps), where
        a, b     = a least-squares fit of a step's wall time against the tokens it scheduled, step time ≈ a + b·x,
                   over the steps that computed tokens (the engine's ``StepMoments``), aged by stepping time
                   (time constant ``TAU_S``): stepping time, not wall time, so an idle worker is not slow;
        C        = the chunk size (tokens per prefill iteration);
        computed share = prompt tokens computed / prompt tokens, aged alike: the queue's prompts are priced
                   whole, and the prefix cache holds some of them.

Why a fit, and not prompt tokens / stepping seconds (the pace before session 59): a step costs a fixed part
(scheduling, sampling, the model's launch) besides its tokens, so a ratio measured at light load, one short prompt
per step, prices a burst's full steps several times too high. Measured from the one warm-up prompt vLLM's benchmark
client sends, that ratio was 0.642 ms a token, 4.5 times the engine's 0.14; the GlobalScheduler priced the 196
prompts of a saturation burst at its 30 s bound and refused 3 of 200 (benchmarks/results/s58_saturation_refusals.md).
The per-step sums also settle the two traps of the ratio: a prompt's tokens are counted with the steps that
computed them, not when its prefill ends (an interval ending one short prompt among others' chunks once priced a
served worker at 20 times its pace: benchmarks/results/prefill_pace_replay.md), and tokens the prefix cache held,
which no step computes, lower the computed share rather than raise the pace (a client resending its prompts once had
56 of 200 refused: vllm_bench_serve_s32.md).

The fit needs steps of more than one size. Until it has them, the pace is full-step steps' own ratio when the steps
were at least half a chunk, and else not measured (0): one step size says nothing of the fixed part, and a guess
from it is either the refusals above or an unbounded queue. Unmeasured, the GlobalScheduler bounds a worker by its
count of queued requests alone; the first burst fills the steps and measures the pace.

Pure (no Ray, no vLLM): the worker feeds it its engine's counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.engine.stats import StepMoments

TAU_S = 2.0  # seconds of stepping over which the sums are aged
MIN_SPREAD = 0.1  # the fit needs step sizes whose standard deviation is at least this share of their mean
FULL_STEP = 0.5  # steps of at least this share of a chunk are full enough to give the pace by their own ratio


class EngineCounters(Protocol):
    """What the pace reads of an engine's published stats (``engine.stats.EngineStats``)."""

    @property
    def prompt_tokens_total(self) -> int: ...  # prompt tokens of the requests prefilled so far

    @property
    def prompt_tokens_computed(self) -> int: ...  # of those, the ones the engine computed (not cached)

    @property
    def step_moments(self) -> StepMoments: ...  # the computing steps' sizes and times, summed


class PrefillPace:
    def __init__(self) -> None:
        self.step_cost: tuple[float, float] | None = None  # (a, b) of step time ≈ a + b·tokens; None: not fitted
        self._moments = StepMoments()  # aged
        self._prompt = 0.0  # aged prompt tokens prefilled
        self._computed = 0.0  # aged prompt tokens of those computed
        self._last: EngineCounters | None = None

    def observe(self, engine: EngineCounters) -> None:
        """The engine's counters as of its latest snapshot."""
        last, self._last = self._last, engine
        if last is None:
            return
        recent = engine.step_moments.minus(last.step_moments)
        prompt = max(engine.prompt_tokens_total - last.prompt_tokens_total, 0)
        computed = max(engine.prompt_tokens_computed - last.prompt_tokens_computed, 0)
        if recent.n <= 0 and prompt == 0:
            return
        decay = math.exp(-max(recent.y, 0.0) / TAU_S)
        self._moments = self._moments.aged(decay, recent)
        self._prompt = self._prompt * decay + prompt
        self._computed = self._computed * decay + computed
        self.step_cost = _fit(self._moments)

    def seconds_per_token(self, chunk: int) -> float:
        """Seconds a queued prompt token costs when the steps are full (0: not measured yet)."""
        m = self._moments
        if self.step_cost is not None:
            a, b = self.step_cost
            per_computed = (a + b * chunk) / chunk
        elif m.n > 0 and m.x / m.n >= FULL_STEP * chunk:
            per_computed = m.y / m.x
        else:
            return 0.0
        share = self._computed / self._prompt if self._prompt > 0 else 1.0
        return per_computed * share

    def queue_wait_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int) -> float:
        """Expected seconds to prefill the queued prompts of lengths ``prompt_lens``."""
        if cost is not None:
            return sum(cost.request_prefill_time(0, n, chunk) for n in prompt_lens)
        return sum(prompt_lens) * self.seconds_per_token(chunk)


def _fit(m: StepMoments) -> tuple[float, float] | None:
    """Least squares of y = a + b·x over the sums ``m``, a and b at least 0; None without enough spread in x."""
    if m.n <= 1:
        return None
    mean_x, mean_y = m.x / m.n, m.y / m.n
    var = m.xx / m.n - mean_x * mean_x
    if var <= (MIN_SPREAD * mean_x) ** 2:
        return None
    b = (m.xy / m.n - mean_x * mean_y) / var
    if b <= 0:  # bigger steps no slower: noise; the steps' mean time is all fixed cost
        return mean_y, 0.0
    a = mean_y - b * mean_x
    if a < 0:  # no fixed cost: the line through the origin
        return 0.0, m.xy / m.xx
    return a, b
