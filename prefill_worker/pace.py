"""How fast a prefill worker gets through prompts, and so how long its queue will take (issue #14).

The GlobalScheduler bounds admission per worker by expected wait: a request
goes only to a prefill worker whose queue it would wait behind for at most
``admission.max_wait_s``. The worker reports that wait with its load:

    queue_wait_s = Σ over queued prompts of the cost model's Cᵖ(r) (SOLA eq. 3, online-corrected), when a
                   cost profile is loaded; else queued prompt tokens × seconds_per_token
    seconds_per_token = seconds the engine spent stepping / prompt tokens it prefilled, both summed over the recent
                   past (each sum aged by stepping time, time constant ``TAU_S``). Stepping time, not wall time: a
                   worker that was idle for most of an interval is not slow. Read by wall time, a lightly loaded
                   worker's burst was priced at 39–44 s of queue and refused while the prompts' TTFT stayed under
                   0.2 s (benchmarks/results/flip_phases.json as of commit 5a74509, the run before this fix).
                   Prompt tokens whole, the ones the prefix cache held included, as the queue's prompts are
                   priced: per *computed* token, an interval of prompts mostly held by the cache (a client
                   sending the same prompts again) priced the next burst at 1.057 ms a token, and the
                   GlobalScheduler refused 56 of 200 prompts at saturation (vllm_bench_serve_s32.md; the
                   refusal's log line, and the same run after this fix, 200 of 200 served:
                   benchmarks/results/saturation_pace_fix_s32.json).
                   A ratio of sums, not an average of each report interval's ratio: the engine counts a prompt's
                   tokens when its prefill ends, so an interval can hold the steps of other prompts' chunks and
                   the end of one short prompt. Averaged per interval, one such interval of a served worker (11
                   tokens in 72 ms of steps) put the pace at 2.1 ms a token, 20 times the run's 0.105, which prices
                   a queue of 14,442 prompt tokens at the bound (benchmarks/results/prefill_pace_replay.md; one
                   saturation run of issue #12's session 48 left 23 of 300 prompts unserved, the refusal's
                   reason not recorded: s48_probe_seqs256.md). Summed, the steps count once with the tokens
                   they prefilled, whichever interval those are counted in.
    Both counters come from one snapshot of the engine (``EngineCounters``), so they cover the same steps.
    local_share = the share of a backlog's prompt tokens this worker prefills itself: prompt tokens that left its
                   queue while it was backlogged (its engine's time for the queue, ``prefill_s``, over
                   ``prefill.offload_wait_s``, when decode workers take prompts from it) to its own engine, over
                   those and the ones decode workers took (``prefill_worker/worker.py`` ``offer_prompts``), each
                   aged by prompt tokens (``SHARE_TOKENS``); 1 until a backlog has been seen, ``MIN_SHARE`` at
                   least. The queue drains faster than the engine's pace by that much, and the queue's wait and
                   the pace this worker reports (``queue_seconds_per_token``, which the GlobalScheduler prices its
                   new placements with) are scaled by it. Unscaled, the pace priced saturation bursts after a
                   warm-up at 31 and 34 s, over the 30 s bound, and 3 and 21 of 200 prompts were refused, where
                   the bursts' last first tokens came at 17.7 and 15.3 s: the decode worker had computed 73 and
                   65 of the prompts, about a third of their tokens (benchmarks/results/s59_prefill_pace_probe.md).
                   Backlogged is judged on the engine's time, not on the scaled wait: judged on the scaled one, a
                   share that fell to 0 priced every queue at 0 s and was never measured again
                   (benchmarks/results/s59_prefill_pace_share_stuck.md).

Pure (no Ray, no vLLM): the worker feeds it its engine's counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from tetriserve.common.cost_estimator import CostEstimator

TAU_S = 2.0  # seconds of stepping over which the pace's sums are aged
SHARE_TOKENS = 20_000.0  # prompt tokens over which the local share's sums are aged
MIN_SHARE = 0.1  # the local share priced at least: decode workers' room is a few prompts each


class EngineCounters(Protocol):
    """What the pace reads of an engine's published stats (``engine.stats.EngineStats``)."""

    @property
    def prompt_tokens_total(self) -> int: ...  # prompt tokens of the requests prefilled so far

    @property
    def step_seconds(self) -> float: ...  # seconds spent inside engine steps so far


class PrefillPace:
    def __init__(self) -> None:
        self.seconds_per_token = 0.0  # 0: not measured yet
        self._seconds = 0.0  # aged stepping seconds
        self._tokens = 0.0  # aged prompt tokens prefilled in them
        self._last: tuple[int, float] | None = None
        self.local_share = 1.0  # of a backlog's prompt tokens, the share prefilled here
        self._here = 0.0  # aged prompt tokens that left a backlogged queue for this worker's engine
        self._away = 0.0  # and for decode workers

    def left_queue(self, tokens: int, offloaded: bool) -> None:
        """A prompt of ``tokens`` left this worker's queue while it was backlogged: to its engine, or
        ``offloaded`` to a decode worker."""
        decay = math.exp(-tokens / SHARE_TOKENS)
        self._here = self._here * decay + (0 if offloaded else tokens)
        self._away = self._away * decay + (tokens if offloaded else 0)
        if self._here + self._away > 0:
            self.local_share = max(MIN_SHARE, self._here / (self._here + self._away))

    @property
    def queue_seconds_per_token(self) -> float:
        """Seconds a queued prompt token adds to the queue's wait: the engine's pace, scaled by the local share."""
        return self.wait_s(self.seconds_per_token)

    def wait_s(self, prefill_s: float) -> float:
        """The queue's wait where the engine would take ``prefill_s``: decode workers take the rest of a backlog."""
        return self.local_share * prefill_s

    def observe(self, engine: EngineCounters) -> None:
        """The engine's counters as of its latest snapshot."""
        now = (engine.prompt_tokens_total, engine.step_seconds)
        if self._last is not None:
            tokens, dt = max(now[0] - self._last[0], 0), max(now[1] - self._last[1], 0.0)
            if dt > 0 or tokens > 0:  # steps of chunks whose prompts end later count now, their tokens then
                decay = math.exp(-dt / TAU_S)
                self._seconds = self._seconds * decay + dt
                self._tokens = self._tokens * decay + tokens
                if self._tokens > 0:
                    self.seconds_per_token = self._seconds / self._tokens
        self._last = now

    def queue_wait_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int | None) -> float:
        """Expected seconds until the queued prompts of lengths ``prompt_lens`` have left the queue (prefilled
        here, or taken by decode workers)."""
        return self.wait_s(self.prefill_s(prompt_lens, cost, chunk))

    def prefill_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int | None) -> float:
        """Expected seconds for this worker's engine to prefill the prompts of lengths ``prompt_lens``."""
        if cost is not None:
            return sum(cost.request_prefill_time(0, n, chunk) for n in prompt_lens)
        return sum(prompt_lens) * self.seconds_per_token
