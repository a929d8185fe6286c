"""How fast a prefill worker gets through prompts, and so how long its queue will take (issue #14).

The GlobalScheduler bounds admission per worker by expected wait: a request
goes only to a prefill worker whose queue it would wait behind for at most
``admission.max_wait_s``. The worker reports that wait with its load:

    queue_wait_s = Σ over queued prompts of the cost model's Cᵖ(r) (SOLA eq. 3, online-corrected), when a
                   cost profile is loaded; else queued prompt tokens × seconds_per_token
    seconds_per_token = seconds the engine spent stepping / prompt tokens it computed, an EWMA over report
                   intervals in which it computed prompts. Stepping time, not wall time: a worker that was
                   idle for most of an interval is not slow. Read by wall time, a lightly loaded worker's
                   burst was priced at 39–44 s of queue and refused while the prompts' TTFT stayed under
                   0.2 s (benchmarks/results/flip_phases.json as of commit 5a74509, the run before this fix)

Pure (no Ray, no vLLM): the worker feeds it its engine's counters.
"""

from __future__ import annotations

from collections.abc import Iterable

from tetriserve.common.cost_estimator import CostEstimator

ALPHA = 0.3  # weight of the newest interval in the EWMA


class PrefillPace:
    def __init__(self) -> None:
        self.seconds_per_token = 0.0  # 0: not measured yet
        self._last: tuple[int, float] | None = None

    def observe(self, computed_tokens: int, busy_s: float) -> None:
        """The engine's count of prompt tokens computed so far, and its seconds spent stepping so far."""
        if self._last is not None:
            tokens, dt = computed_tokens - self._last[0], busy_s - self._last[1]
            if tokens > 0 and dt > 0:
                sample = dt / tokens
                self.seconds_per_token = (
                    sample if self.seconds_per_token == 0 else ALPHA * sample + (1 - ALPHA) * self.seconds_per_token
                )
        self._last = (computed_tokens, busy_s)

    def queue_wait_s(self, prompt_lens: Iterable[int], cost: CostEstimator | None, chunk: int | None) -> float:
        """Expected seconds to prefill the queued prompts of lengths ``prompt_lens``."""
        if cost is not None:
            return sum(cost.request_prefill_time(0, n, chunk) for n in prompt_lens)
        return sum(prompt_lens) * self.seconds_per_token
