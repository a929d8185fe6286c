"""SCLS's serving-time estimator (SCLS §4.2, eq. 1–4) and memory estimator (SCLS §4.3, eq. 5–9). Pure.

A batch of N requests, padded to its longest input L_i, that generates L_o tokens:

    T_serve(N, L_i, L_o)  = T_prefill(N, L_i) + T_decode(N, L_i, L_o)                     (eq. 1)
    T_decode(N, L_i, L_o) = Σ_{l=1..L_o} τ_decode(L_i + l, N)                             (eq. 2)
    T_prefill(N, L_i)     = p1·N·L_i + p2·N + p3·L_i + p4                                 (eq. 3)
    τ_decode(l, N)        = d1·N·l + d2·N + d3·l + d4                                     (eq. 4)

Eq. 2 over eq. 4 has a closed form, (d1·N + d3)·(L_o·L_i + L_o·(L_o + 1)/2) + L_o·(d2·N + d4), so a
slice of S iterations (L_o = S) costs a handful of operations however long it is.

    M_kv(N, L_i, L_o)     = (L_i + L_o)·N·Δ                                               (eq. 5)
    M_ava                 = M_cap − M_model − M_engine                                    (eq. 6)
    no OOM  ⇔  M_kv(N, L_i, S) ≤ ζ·M_ava                                                  (eq. 7; eq. 9 with ζ)
    N_max                 = ⌊ζ·M_ava / (Δ·(L_i + S))⌋                                     (eq. 8 under eq. 9)

ζ is the paper's 0.9 (§5.1, its Hugging Face workers). Δ is the KV bytes one token holds; any unit does, as
long as M_ava is in the same one (the decode admission policy counts both in tokens: Δ = 1 and M_ava the
engine's KV pool in tokens, which is eq. 6 as vLLM sizes it). Eq. 3 and eq. 4 are fitted by least squares
on the features (N·L, N, L, 1), as the paper's ``curve_fit`` does on a linear model, each sample weighted by
the inverse of its time and every coefficient kept non-negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tetriserve.common.coerce import as_float

ZETA = 0.9  # SCLS §5.1: ζ of eq. 9


@dataclass(frozen=True)
class ServingTime:
    """Eq. 1–4: seconds to serve a static batch, from the fitted prefill (p) and decode-iteration (d) terms.

    The defaults are this project's tiny model on the 2-core CPU machine (bfloat16, one thread), as one
    ``tetriserve profile --threads 1`` run fitted them there (mean relative error 14.9% for eq. 3 and 10.3% for
    eq. 4, over a measurement noise of 23% and 40%), to three significant figures; a fit moves from run to run
    (docs/policies/scls.md), and the profile of another model or machine replaces them.
    """

    p1: float = 3.2e-5
    p2: float = 5.95e-5
    p3: float = 4.75e-6
    p4: float = 2.78e-3
    d1: float = 2.9e-7
    d2: float = 1.0e-4
    d3: float = 0.0
    d4: float = 3.07e-3

    def t_prefill(self, n: int, li: int) -> float:
        """Eq. 3."""
        return self.p1 * n * li + self.p2 * n + self.p3 * li + self.p4

    def tau_decode(self, cached: int, n: int) -> float:
        """Eq. 4: one decoding iteration of ``n`` requests each holding ``cached`` tokens."""
        return self.d1 * n * cached + self.d2 * n + self.d3 * cached + self.d4

    def t_decode(self, n: int, li: int, lo: int) -> float:
        """Eq. 2 summed in closed form over l = 1..lo."""
        if lo <= 0:
            return 0.0
        return (self.d1 * n + self.d3) * (lo * li + lo * (lo + 1) / 2) + lo * (self.d2 * n + self.d4)

    def t_serve(self, n: int, li: int, lo: int) -> float:
        """Eq. 1; a batch of no requests takes no time."""
        if n <= 0:
            return 0.0
        return self.t_prefill(n, li) + self.t_decode(n, li, lo)

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ServingTime:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"SCLS serving-time estimator: unknown fields {unknown}")
        return cls(**{k: as_float(v) for k, v in data.items()})


@dataclass(frozen=True)
class MemoryEstimator:
    """Eq. 5–9: whether a batch of N requests, padded to L_i, fits ζ·M_ava for a slice of S tokens."""

    m_ava: float  # eq. 6, in the unit of ``delta``
    delta: float = 1.0  # Δ: memory per token of KV
    zeta: float = ZETA

    def __post_init__(self) -> None:
        if self.delta <= 0:
            raise ValueError(f"SCLS memory estimator: Δ must be > 0, got {self.delta}")
        if not 0 < self.zeta <= 1:
            raise ValueError(f"SCLS memory estimator: ζ must be in (0, 1], got {self.zeta}")

    @staticmethod
    def available(m_cap: float, m_model: float, m_engine: float) -> float:
        """Eq. 6."""
        return m_cap - m_model - m_engine

    def m_kv(self, n: int, li: int, lo: int) -> float:
        """Eq. 5."""
        return (li + lo) * n * self.delta

    def fits(self, n: int, li: int, s: int, used: float = 0.0) -> bool:
        """Eq. 9 (eq. 7 with ζ = 1): no OOM while the batch serves its slice; ``used``: KV memory that
        requests already being served hold (0 for a static batch, which runs alone)."""
        return self.m_kv(n, li, s) + used <= self.zeta * self.m_ava

    def oom(self, n: int, li: int, s: int, used: float = 0.0) -> bool:
        """Algorithm 1's OOM(N, L_i, S): the negation of eq. 9."""
        return not self.fits(n, li, s, used)

    def n_max(self, li: int, s: int) -> int:
        """Eq. 8 under eq. 9: the largest batch of inputs padded to ``li`` that serves a slice of ``s``."""
        if li + s <= 0:
            raise ValueError("SCLS N_max: L_i + S must be > 0")
        return max(0, math.floor(self.zeta * self.m_ava / (self.delta * (li + s))))


def kv_bytes_per_token(layers: int, kv_heads: int, head_size: int, itemsize: int) -> int:
    """Δ of eq. 5: one token's K and V in every layer."""
    return 2 * layers * kv_heads * head_size * itemsize


def _fit4(rows: Sequence[tuple[float, float, float, float]], ys: Sequence[float]) -> tuple[float, ...]:
    """Least squares of ``ys`` on ``rows``, each sample weighted by 1/y (its relative error counts, short
    iterations as much as long ones), with non-negative coefficients (a negative term would price a small
    batch below its own parts, or below zero)."""
    from scipy.optimize import nnls

    if len(ys) < 1:
        raise ValueError("SCLS estimator fit: no samples")
    x = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
    y = np.asarray(ys, dtype=np.float64)
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    return tuple(float(c) for c in coef)


def fit_serving_time(
    prefill: Sequence[tuple[int, int, float]], decode: Sequence[tuple[int, int, float]]
) -> ServingTime:
    """Fit eq. 3 to (N, L_i, seconds) prefill iterations and eq. 4 to (cached length l, N, seconds) decoding
    iterations by relative, non-negative least squares. A term the samples cannot tell apart from another
    (every prefill sample with N = 1, say) gets a share that predicts the sampled range as well."""
    p = _fit4([(n * li, n, li, 1.0) for n, li, _ in prefill], [t for *_, t in prefill])
    d = _fit4([(n * cached, n, cached, 1.0) for cached, n, _ in decode], [t for *_, t in decode])
    return ServingTime(*p, *d)


@dataclass(frozen=True)
class SclsProfile:
    """The estimators' parameters as `tetriserve profile` fits them on one engine: eq. 3 and eq. 4's
    coefficients, Δ (KV bytes per token) and M_ava (eq. 6: the KV pool vLLM sized, in bytes)."""

    serving: ServingTime
    kv_bytes_per_token: float
    kv_pool_bytes: float

    @property
    def memory(self) -> MemoryEstimator:
        return MemoryEstimator(m_ava=self.kv_pool_bytes, delta=self.kv_bytes_per_token)

    def to_json(self) -> dict[str, object]:
        return {
            "serving": self.serving.to_json(),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_pool_bytes": self.kv_pool_bytes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SclsProfile:
        serving = data["serving"]
        if not isinstance(serving, Mapping):
            raise TypeError("scls.serving must be an object")
        return cls(
            ServingTime.from_json(serving), as_float(data["kv_bytes_per_token"]), as_float(data["kv_pool_bytes"])
        )
