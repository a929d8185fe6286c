"""How fast a prefill worker gets through prompts, and so how long its queue will take (issue #14).

The GlobalScheduler bounds admission per worker by expected wait: a request
goes only to a prefill worker whose queue it would wait behind for at most
``admission.max_wait_s``. The worker reports that wait with its load:

    queue_wait_s = Σ over queued prompts of the cost model's Cᵖ(r) (SOLA eq. 3, online-corrected), when a
                   cost profile is loaded; else queued prompt tokens × seconds_per_token
    seconds_per_token = seconds the engine spent stepping / prompt tokens it prefilled, both summed over the recent
                   past (each sum aged by stepping time, time constant ``TAU_S``), counting only the report
                   intervals that began with prompts waiting for the engine (a backlog, whose steps are full), and
                   0 ("not measured") until those hold ``MIN_MEASURED_S`` of stepping. The pace prices backlogs
                   only, and a step costs a fixed few milliseconds whatever it carries: measured on a fresh
                   service's smoke test (two single ShareGPT prompts, 1.858 ms a token), it priced a burst of
                   200 prompts at 91.4 s and the GlobalScheduler refused 23 of them, where the last first token
                   came at 17.8 s (session 62, benchmarks/results/s62_pace_smoke_before.md; after this change 0
                   refused, s62_pace_smoke_200_after.md). Stepping time, not wall time: a
                   worker that was idle for most of an interval is not slow. Read by wall time, a lightly loaded
                   worker's burst was priced at 39–44 s of queue and refused while the prompts' TTFT stayed under
                   0.2 s (benchmarks/results/flip_phases.json as of commit 5a74509, the run before this fix).
                   Prompt tokens whole, the ones the prefix cache held included, as the queue's prompts are
                   priced: per *computed* token, an interval of prompts mostly held by the cache (a client
                   sending the same prompts again) priced the next burst at 1.057 ms a token, and the
                   GlobalScheduler refused 56 of 200 prompts at saturation (vllm_bench_serve_s32.md; the
                   refusal's log line, and the same run after this fix, 200 of 200 served:
                   benchmarks/results/saturation_pace_fix_s32.json).
                   The computed tokens count as the scheduler schedules them, step by step (its iteration log's
                   ``tokens``); the cached ones as their prompts' prefill ends (vLLM's count), when the cache's
                   share is known. vLLM counts a prompt's tokens only when its prefill ends: counted so, the
                   pace lagged a burst's steps: after a smoke test, 455 of a 600-prompt burst were refused where
                   the last served prompt's first token came at 15 s (session 62,
                   benchmarks/results/s62_pace_smoke_flood.md; counted step by step, 343 of 600 were refused and
                   the last first token came at 33.8 s: s62_pace_smoke_600_after.md).
                   A ratio of sums, not an average of each report interval's ratio: averaged per interval, one
                   interval of a served worker in which one short prompt ended among other prompts' chunks (11
                   tokens in 72 ms of steps, as vLLM counted them) put the pace at 2.1 ms a token, 20 times the
                   run's 0.105, which prices a queue of 14,442 prompt tokens at the bound
                   (benchmarks/results/prefill_pace_replay.md; one saturation run of issue #12's session 48 left
                   23 of 300 prompts unserved, the refusal's reason not recorded: s48_probe_seqs256.md).
    The counters come from one snapshot of the engine (``EngineCounters`` and the iteration log's count published
    with it), so they cover the same steps.
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
MIN_MEASURED_S = 0.5  # seconds of backlogged stepping the pace needs before it is reported
SHARE_TOKENS = 20_000.0  # prompt tokens over which the local share's sums are aged
MIN_SHARE = 0.1  # the local share priced at least: decode workers' room is a few prompts each


class EngineCounters(Protocol):
    """What the pace reads of an engine's published stats (``engine.stats.EngineStats``)."""

    @property
    def prompt_tokens_cached(self) -> int: ...  # prompt tokens the prefix cache held, as their prefills ended

    @property
    def step_seconds(self) -> float: ...  # seconds spent inside engine steps so far


class PrefillPace:
    def __init__(self) -> None:
        self.seconds_per_token = 0.0  # 0: not measured yet
        self._seconds = 0.0  # aged stepping seconds
        self._tokens = 0.0  # aged prompt tokens prefilled in them
        self._measured_s = 0.0  # backlogged stepping seconds seen, not aged
        self._last: tuple[int, float] | None = None
        self._backlogged = False  # whether prompts waited for the engine at the last observation
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

    def observe(self, engine: EngineCounters, computed_tokens: int, backlogged: bool) -> None:
        """The engine's counters as of its latest snapshot, with ``computed_tokens``, the prompt tokens its
        scheduler has scheduled so far (published with them); ``backlogged``: prompts are waiting for the engine
        now. The interval since the last observation counts if they were waiting at its start."""
        now = (computed_tokens + engine.prompt_tokens_cached, engine.step_seconds)
        if self._last is not None and self._backlogged:
            tokens, dt = max(now[0] - self._last[0], 0), max(now[1] - self._last[1], 0.0)
            if dt > 0 or tokens > 0:
                decay = math.exp(-dt / TAU_S)
                self._seconds = self._seconds * decay + dt
                self._tokens = self._tokens * decay + tokens
                self._measured_s += dt
                if self._tokens > 0 and self._measured_s >= MIN_MEASURED_S:
                    self.seconds_per_token = self._seconds / self._tokens
        self._last = now
        self._backlogged = backlogged

    def queue_wait_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int | None) -> float:
        """Expected seconds until the queued prompts of lengths ``prompt_lens`` have left the queue (prefilled
        here, or taken by decode workers)."""
        return self.wait_s(self.prefill_s(prompt_lens, cost, chunk))

    def prefill_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int | None) -> float:
        """Expected seconds for this worker's engine to prefill the prompts of lengths ``prompt_lens``."""
        if cost is not None:
            return sum(cost.request_prefill_time(0, n, chunk) for n in prompt_lens)
        return sum(prompt_lens) * self.seconds_per_token
