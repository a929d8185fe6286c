"""How well output-length predictions hit: each finished request's predicted range against its true length.

TetriInfer §3.3.2 predicts a range (bucket) of generated tokens; a prediction
is scored when its request ends normally (stop or length) on the worker that
decoded it::

    actual < lower            ─▶ under    (the request was shorter than its predicted bucket)
    lower <= actual < upper   ─▶ within   (it landed in its predicted bucket)
    actual >= upper           ─▶ over     (it ran past its predicted bucket)

with ``|actual - estimate|`` summed, so a dashboard shows the share in the
bucket and the mean absolute error. Counts are kept per predictor (the
estimate's ``source``). The metrics exporter publishes ``snapshot()``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tetriserve.common.length import LengthEstimate

OUTCOMES = ("under", "within", "over")


def outcome(estimate: LengthEstimate, actual: int) -> str:
    """Where ``actual`` fell against the predicted range: under, within or over."""
    if actual < estimate.lower:
        return "under"
    if actual < estimate.upper or estimate.lower == estimate.upper == actual:
        return "within"
    return "over"


@dataclass(frozen=True)
class LengthScoreStats:
    """Cumulative scores: ``counts[(source, outcome)]`` requests, ``abs_error[source]`` summed tokens."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    abs_error: dict[str, int] = field(default_factory=dict)


class LengthScore:
    """Accumulates scores; safe to read from another thread (``snapshot``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._abs_error: dict[str, int] = {}

    def observe(self, estimate: LengthEstimate | None, actual: int) -> None:
        """Score one finished request (``estimate`` None: it had none, nothing is counted)."""
        if estimate is None:
            return
        key = (estimate.source, outcome(estimate, actual))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._abs_error[estimate.source] = self._abs_error.get(estimate.source, 0) + abs(actual - estimate.estimate)

    def snapshot(self) -> LengthScoreStats:
        with self._lock:
            return LengthScoreStats(dict(self._counts), dict(self._abs_error))
