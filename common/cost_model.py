"""Iteration cost models (SOLA §5.2, eq. 3–5; SCLS's estimators are the same family).

    prefill:  Cᵖ = a₀·Σ l_has·l_in + b₀·Σ l_in² + c₀·Σ l_in + d₀        (eq. 3)
    decode:   Cᵈ = a₁·B + b₁·Σ l_has + c₁                              (eq. 4)
    online:   γᵢ = α·t/C₀ + (1−α)·γᵢ₋₁ ,   Cᵢ = γᵢ·C₀                  (eq. 5)

``l_in`` is the number of tokens a request computes in the iteration (a chunk
when chunked), ``l_has`` the tokens whose KV it already holds. The models are
fitted with ``scipy.optimize.curve_fit`` on samples from ``tetriserve profile``
(or any iteration log). The prompt-computing scheduler adapters correct Cᵖ online from measured iteration
times (eq. 5); the decode model is read by SOLA's decode admission, which corrects it from the measured step
time, and by SOLA's eq. 2 on a colocated engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PrefillBatch = Sequence[tuple[int, int]]  # (l_has, l_in) per request in one iteration


def prefill_features(batch: PrefillBatch) -> tuple[float, float, float]:
    """(Σ l_has·l_in, Σ l_in², Σ l_in) of one iteration."""
    return (
        float(sum(h * n for h, n in batch)),
        float(sum(n * n for _, n in batch)),
        float(sum(n for _, n in batch)),
    )


@dataclass(frozen=True)
class PrefillCost:
    """SOLA eq. 3: seconds for one prefill iteration."""

    a0: float
    b0: float
    c0: float
    d0: float

    def predict(self, batch: PrefillBatch) -> float:
        if not batch:
            return 0.0
        x1, x2, x3 = prefill_features(batch)
        return max(0.0, self.a0 * x1 + self.b0 * x2 + self.c0 * x3 + self.d0)

    def request_time(self, computed: int, remaining: int, chunk: int | None = None) -> float:
        """Cᵖ(r): time to prefill ``remaining`` tokens after ``computed``, alone, in chunks of ``chunk`` tokens."""
        if remaining <= 0:
            return 0.0
        step = remaining if chunk is None or chunk <= 0 else chunk
        total, has = 0.0, computed
        while remaining > 0:
            n = min(step, remaining)
            total += self.predict([(has, n)])
            has, remaining = has + n, remaining - n
        return total

    def scaled(self, gamma: float) -> PrefillCost:
        return PrefillCost(self.a0 * gamma, self.b0 * gamma, self.c0 * gamma, self.d0 * gamma)


@dataclass(frozen=True)
class DecodeCost:
    """SOLA eq. 4: seconds for one decode iteration over requests holding ``context_lens`` tokens."""

    a1: float
    b1: float
    c1: float

    def predict(self, context_lens: Sequence[int]) -> float:
        if not context_lens:
            return 0.0
        return max(0.0, self.a1 * len(context_lens) + self.b1 * float(sum(context_lens)) + self.c1)

    def scaled(self, gamma: float) -> DecodeCost:
        return DecodeCost(self.a1 * gamma, self.b1 * gamma, self.c1 * gamma)


def _nonneg_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients via ``curve_fit`` (bounded trust-region)."""
    from scipy.optimize import curve_fit

    # a feature that is zero in every sample (e.g. no chunked iteration, so Σ l_has·l_in = 0) cannot be
    # identified: its coefficient is 0, not whatever the optimiser started from
    active = np.flatnonzero(np.any(x != 0.0, axis=0))
    if len(y) < max(len(active), 1):
        raise ValueError(f"cost model fit needs at least {max(len(active), 1)} samples, got {len(y)}")

    def model(xs: np.ndarray, *coef: float) -> np.ndarray:
        return np.asarray(xs @ np.asarray(coef))

    # relative error is what matters: weight each sample by 1/y so short iterations count as much as long ones
    sigma = np.maximum(y, 1e-9)
    p0 = np.full(len(active), 1e-6)
    fitted, _ = curve_fit(model, x[:, active], y, p0=p0, sigma=sigma, bounds=(0.0, np.inf))
    coef = np.zeros(x.shape[1])
    coef[active] = fitted
    return coef


def fit_prefill(samples: Sequence[tuple[PrefillBatch, float]]) -> PrefillCost:
    """Fit eq. 3 to (iteration composition, seconds) samples."""
    x = np.array([[*prefill_features(b), 1.0] for b, _ in samples], dtype=np.float64).reshape(-1, 4)
    y = np.array([t for _, t in samples], dtype=np.float64)
    a0, b0, c0, d0 = _nonneg_fit(x, y)
    return PrefillCost(float(a0), float(b0), float(c0), float(d0))


def fit_decode(samples: Sequence[tuple[Sequence[int], float]]) -> DecodeCost:
    """Fit eq. 4 to (context lengths of the batch, seconds) samples."""
    x = np.array([[len(c), float(sum(c)), 1.0] for c, _ in samples], dtype=np.float64).reshape(-1, 3)
    y = np.array([t for _, t in samples], dtype=np.float64)
    a1, b1, c1 = _nonneg_fit(x, y)
    return DecodeCost(float(a1), float(b1), float(c1))


def mean_abs_pct_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean |predicted − measured| / measured, the accuracy figure SOLA §6.3.2 reports (4.98–5.92%)."""
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m > 0]
    if not pairs:
        return math.nan
    return float(sum(abs(p - m) / m for p, m in pairs) / len(pairs))


class OnlineCorrection:
    """SOLA eq. 5: an exponentially smoothed ratio of measured to modelled iteration time."""

    def __init__(self, alpha: float = 0.2, gamma: float = 1.0) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"cost correction alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.gamma = gamma

    def observe(self, base_prediction: float, measured: float) -> float:
        """Fold one iteration's (C₀ prediction, measured seconds) in; returns the new γ."""
        if base_prediction > 0 and measured > 0:
            self.gamma = self.alpha * measured / base_prediction + (1.0 - self.alpha) * self.gamma
        return self.gamma
