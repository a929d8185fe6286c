"""How fast a prefill worker gets through prompts, and so how long its queue will take.

The GlobalScheduler bounds admission per worker by expected wait: a request goes only to a prefill worker whose
queue it would wait behind for at most ``admission.max_wait_s``. The worker reports that wait with its load:

    queue_wait_s = local_share × the engine's time for the queue: Σ over queued prompts of the cost model's
                   Cᵖ(r) (SOLA eq. 3, online-corrected) when a cost profile is loaded, else queued prompt
                   tokens × seconds_per_token
    seconds_per_token = seconds the engine spent stepping / prompt tokens it prefilled, both summed over the
                   recent past (each sum aged by stepping time, time constant ``TAU_S``), counting only the
                   report intervals that began with prompts waiting for the engine; 0 ("not measured") until
                   those intervals hold ``MIN_MEASURED_S`` of stepping
    local_share = the share of a backlog's prompt tokens this worker prefills itself: prompt tokens that left its
                   queue for its own engine while it was backlogged, over those and the ones decode workers
                   took (``Offloader.offer_prompts``, ``prefill_worker/offload.py``), each sum aged by prompt tokens
                   (``SHARE_TOKENS``); 1 until a backlog has been seen, ``MIN_SHARE`` at least. The pace this
                   worker reports (``queue_seconds_per_token``, which the GlobalScheduler prices its new
                   placements with) is scaled by it too.

The counters come from one snapshot of the engine (``EngineCounters`` and the iteration log's count published
with it), so they cover the same steps. Each choice guards against a way the pace misprices a burst; the
measurements come from ``python benchmarks/diagnostics/prefill_pace_probe.py`` (a fresh server, a warm-up, then
a burst; the admission bound 30 s) unless another command is given:

- Backlogged intervals only. A step costs a fixed few milliseconds whatever it carries, so a pace measured on
  light load overprices a burst: counting every interval, a fresh service's smoke test (two single ShareGPT
  prompts) sets the pace at 1.858 ms a token, which prices a burst of 200 prompts at 91.4 s, and 23 are
  refused where the last first token comes at 17.8 s (``--warmup smoke --num-prompts 200 --rounds 1
  --commit a46ce67``); counting backlogs only, none is refused (the same without ``--commit``).
- Stepping time, not wall time: a worker that was idle for most of an interval is not slow. Read by wall time,
  the pace prices a lightly loaded worker's burst at 39–44 s of queue and refuses it while the prompts' TTFT
  stays under 0.2 s (the ``python benchmarks/flip_phases.py`` run committed in 5a74509, taken with the pace
  read by wall time).
- Prompt tokens whole, the ones the prefix cache held included, as the queue's prompts are priced. Per
  *computed* token, an interval of prompts mostly held by the cache (a client sending the same prompts again)
  prices the next burst at 1.057 ms a token, and 56 of 200 prompts are refused at saturation; counted whole,
  200 of 200 are served (``python benchmarks/vllm_bench_serve.py --systems tetriserve --scenarios saturation
  --rounds 1 --num-prompts 200``).
- Computed tokens counted as the scheduler schedules them, step by step (its iteration log's ``tokens``); the
  cached ones as their prompts' prefill ends (vLLM's count), when the cache's share is known. Counted only as
  each prompt's prefill ends, the pace lags a burst's steps: after a smoke test, 455 of a 600-prompt burst are
  refused where the last served prompt's first token comes at 15 s; counted step by step, 343 of 600 are
  refused and the last first token comes at 33.8 s, past the bound (``--warmup smoke --num-prompts 600
  --rounds 1``).
- A ratio of sums, not an average of each report interval's ratio. Averaged per interval, one interval of a
  served worker in which one short prompt ended among other prompts' chunks (11 tokens in 72 ms of steps, as
  vLLM counts them) puts the pace at 2.1 ms a token, 20 times the run's 0.105, which prices a queue of 14,442
  prompt tokens at the bound (``python benchmarks/diagnostics/prefill_pace_replay.py``).
- Scaled by the local share: the queue drains faster than the engine's pace when decode workers take prompts
  from it. Unscaled, the pace prices saturation bursts after a warm-up at 31 and 34 s, over the bound, and 3
  and 21 of 200 prompts are refused, where the bursts' last first tokens come at 17.7 and 15.3 s: the decode
  worker computes 73 and 65 of the prompts, about a third of their tokens (``--rounds 2 --commit ada26d0``).
- Backlogged judged on the engine's time for the queue (``prefill_s`` over ``prefill.offload_wait_s``, when
  decode workers take prompts), not on the scaled wait, and the share ``MIN_SHARE`` at least: judged on the
  scaled wait, a share that falls to 0 prices every queue at 0 s, nothing more is offloaded, and the share is
  never measured again (``--rounds 2 --commit c4a9188``).

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
        self.seconds_per_token = 0.0  # 0: not measured
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
