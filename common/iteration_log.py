"""What a scheduler adapter records per engine iteration, and the aggregates it reports.

Each record holds the iteration's composition (request, l_has, l_in), the
token budget the policy set, how long the policy's own decision took
(``overhead_s``: the scheduling overhead SOLA §6.4 and AccelGen report as a
share of serving time), the measured execution time, and the cost model's
prediction for it (with the online correction in force before the iteration),
so the fit error in service is a number, not a hope.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class IterationRecord:
    started: float  # wall clock (time.time()) when scheduling began
    budget: int
    chunks: tuple[tuple[str, int, int], ...]  # (request_id, l_has, l_in)
    overhead_s: float
    exec_s: float
    predicted_s: float | None = None

    @property
    def tokens(self) -> int:
        return sum(n for _, _, n in self.chunks)


@dataclass(frozen=True)
class IterationStats:
    iterations: int
    tokens: int
    overhead_s: float
    exec_s: float
    fit_error: float | None  # mean |predicted − measured| / measured over iterations with a prediction
    gamma: float | None

    @property
    def overhead_share(self) -> float:
        total = self.overhead_s + self.exec_s
        return self.overhead_s / total if total > 0 else 0.0


class IterationLog:
    """Thread-safe: the engine thread appends, the worker's event loop reads."""

    def __init__(self, keep: int = 20000) -> None:
        self._records: deque[IterationRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._n = 0
        self._tokens = 0
        self._overhead = 0.0
        self._exec = 0.0
        self._err_sum = 0.0
        self._err_n = 0
        self.gamma: float | None = None

    def add(self, rec: IterationRecord) -> None:
        with self._lock:
            self._records.append(rec)
            self._n += 1
            self._tokens += rec.tokens
            self._overhead += rec.overhead_s
            self._exec += rec.exec_s
            if rec.predicted_s is not None and rec.exec_s > 0:
                self._err_sum += abs(rec.predicted_s - rec.exec_s) / rec.exec_s
                self._err_n += 1

    def records(self, since: float = 0.0) -> list[IterationRecord]:
        with self._lock:
            return [r for r in self._records if r.started >= since]

    def stats(self) -> IterationStats:
        with self._lock:
            err = self._err_sum / self._err_n if self._err_n else None
            return IterationStats(self._n, self._tokens, self._overhead, self._exec, err, self.gamma)
