"""Confidence-based padding of a predicted output length (CacheOpt §3.2, eq. 2-4).

For request i with predicted length X̂ᵢ and actual length Xᵢ ∈ [aᵢ, bᵢ], Hoeffding's
inequality bounds one side of the deviation:

    P(Xᵢ - X̂ᵢ ≥ tᵢ) ≤ exp(-2tᵢ² / (bᵢ - aᵢ)²)                          (eq. 2)
    setting the bound to 1 - cᵢ:  tᵢ = sqrt(-(bᵢ - aᵢ)²/2 · ln(1 - cᵢ))   (eq. 3)
    the confidence falls as the arrival rate λ rises:  cᵢ = alpha / (1 + βλ)  (eq. 4)

    predicted length X̂ ──┐      deviation direction (classifier): under ──▶ E = X̂ + t
    predicted bucket k ──▶ (b-a)ₖ ─▶ t ◀── c ◀── λ (ArrivalRateMeter)   over  ──▶ E = X̂ - t

* ``(b - a)`` is fitted per *predicted bucket* from validation residuals
  ``r = actual - predicted``, one width per direction: the under-prediction width is
  the ``quantile`` of the positive residuals (a = 0, b = that quantile), the
  over-prediction width the same of ``|negative residuals|``. A quantile rather
  than the max keeps one 8000-token outlier from setting every padding; buckets
  with fewer than ``min_count`` residuals of a side use the global width.
* The padded estimate E is what a CacheOpt-style policy reserves; the served
  ``LengthEstimate`` carries it as ``estimate`` and widens the classifier's bucket
  range just enough to contain it (``lower = min(bucket lower, E)``,
  ``upper = max(bucket upper, E + 1)``), with ``confidence = c``.

Everything here is pure: the meter takes ``now`` from the caller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tetriserve.common.length import LengthEstimate
from tetriserve.length_predictor.buckets import BucketSpec


def hoeffding_padding(width: float, confidence: float) -> float:
    """Eq. 3: t = sqrt(-width²/2 · ln(1 - c)); 0 at c = 0, unbounded as c → 1."""
    if width < 0:
        raise ValueError(f"width must be >= 0, got {width}")
    if not 0.0 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0, 1), got {confidence}")
    return math.sqrt(-(width**2) / 2.0 * math.log(1.0 - confidence))


def confidence_for_rate(rate: float, alpha: float, beta: float) -> float:
    """Eq. 4: c = alpha / (1 + βλ), with λ in requests per second."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1) (c = 1 would pad infinitely), got {alpha}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if rate < 0:
        raise ValueError(f"rate must be >= 0, got {rate}")
    return alpha / (1.0 + beta * rate)


@dataclass(frozen=True)
class PaddingParams:
    """Eq. 4's parameters, or a fixed confidence (experiments, CacheOpt Fig. 17g/h).

    Attributes:
        alpha: the confidence at zero load (0 < alpha < 1).
        beta: sensitivity to the arrival rate, seconds per request (β > 0).
        fixed_confidence: when set, used instead of eq. 4.
        window_s: the arrival-rate meter's sliding window.
    """

    alpha: float = 0.95
    beta: float = 0.01
    fixed_confidence: float | None = None
    window_s: float = 10.0

    def __post_init__(self) -> None:
        confidence_for_rate(0.0, self.alpha, self.beta)  # validates alpha and beta
        if self.fixed_confidence is not None and not 0.0 <= self.fixed_confidence < 1.0:
            raise ValueError(f"PaddingParams.fixed_confidence must be in [0, 1), got {self.fixed_confidence}")
        if self.window_s <= 0:
            raise ValueError(f"PaddingParams.window_s must be > 0, got {self.window_s}")

    def confidence(self, rate: float) -> float:
        if self.fixed_confidence is not None:
            return self.fixed_confidence
        return confidence_for_rate(rate, self.alpha, self.beta)


class ArrivalRateMeter:
    """Arrivals per second over a sliding window: count of arrivals in (now - window, now] / window."""

    def __init__(self, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._times: deque[float] = deque()

    def record(self, now: float, count: int = 1) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._times.extend([now] * count)
        self._expire(now)

    def rate(self, now: float) -> float:
        self._expire(now)
        return len(self._times) / self.window_s

    def _expire(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()


@dataclass(frozen=True)
class BucketWidths:
    """Per-predicted-bucket ``(b - a)`` for each deviation direction, in tokens."""

    under: tuple[float, ...]
    over: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.under) != len(self.over):
            raise ValueError(f"BucketWidths.under ({len(self.under)}) and .over ({len(self.over)}) differ in length")
        if any(w < 0 for w in (*self.under, *self.over)):
            raise ValueError("BucketWidths entries must be >= 0")

    def width(self, bucket: int, under: bool) -> float:
        return (self.under if under else self.over)[bucket]


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sequence."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fit_widths(
    predicted_buckets: Sequence[int],
    residuals: Sequence[float],
    num_buckets: int,
    quantile: float = 0.9,
    min_count: int = 20,
) -> BucketWidths:
    """Fit ``(b - a)`` per predicted bucket and direction from validation residuals (actual - predicted)."""
    if len(predicted_buckets) != len(residuals):
        raise ValueError("predicted_buckets and residuals must have the same length")
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    pos = [r for r in residuals if r > 0]
    neg = [-r for r in residuals if r < 0]
    glob_under = _quantile(pos, quantile) if pos else 0.0
    glob_over = _quantile(neg, quantile) if neg else 0.0
    under: list[float] = []
    over: list[float] = []
    for k in range(num_buckets):
        rs = [r for b, r in zip(predicted_buckets, residuals, strict=True) if b == k]
        kp = [r for r in rs if r > 0]
        kn = [-r for r in rs if r < 0]
        under.append(_quantile(kp, quantile) if len(kp) >= min_count else glob_under)
        over.append(_quantile(kn, quantile) if len(kn) >= min_count else glob_over)
    return BucketWidths(tuple(under), tuple(over))


def padded_length(predicted: float, under: bool, width: float, confidence: float) -> int:
    """E = X̂ ± t by the deviation direction, rounded, never below 0."""
    t = hoeffding_padding(width, confidence)
    return max(0, round(predicted + t if under else predicted - t))


def padded_estimate(
    predicted: float,
    under: bool,
    bucket: int,
    spec: BucketSpec,
    widths: BucketWidths,
    confidence: float,
    max_tokens: int,
    source: str = "trained",
) -> LengthEstimate:
    """The served estimate: E capped at ``max_tokens``, inside the bucket range widened to contain it."""
    e = min(padded_length(predicted, under, widths.width(bucket, under), confidence), max(max_tokens, 0))
    lo, hi = spec.served_range(bucket, max_tokens)
    return LengthEstimate(min(lo, e), e, max(hi, e + 1), bucket, round(confidence, 4), source)
