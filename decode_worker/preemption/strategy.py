"""Swap or recompute a preempted request, by the sweet-spot length (CacheOpt §2.5, §3.5).

Both latencies are profiled on the real engine and fitted (``benchmarks/decode_policies.py``
does both and saves the pair, the file ``decode.preemption.profile`` names):

    recompute   L_r(S) = α_r·S^β_r + κ_r·S + ε_r     (polynomial: attention is quadratic in S)
    swap        L_s(S) = γ_s·S + δ_s                  (linear in the bytes moved, out and back in)

The sweet spot S_s is the length where L_r(S) = L_s(S); a victim whose context is
at least S_s is swapped, a shorter one recomputed. ``mode="swap"`` or
``"recompute"`` fixes the choice whatever the length (vLLM v1 alone only recomputes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Mode = Literal["recompute", "swap", "auto"]
MODES: tuple[Mode, ...] = ("recompute", "swap", "auto")


@dataclass(frozen=True)
class RecomputeLatency:
    alpha: float
    beta: float
    kappa: float
    eps: float

    def __call__(self, s: float) -> float:
        return float(self.alpha * s**self.beta + self.kappa * s + self.eps)


@dataclass(frozen=True)
class SwapLatency:
    gamma: float
    delta: float

    def __call__(self, s: float) -> float:
        return self.gamma * s + self.delta


def fit_recompute(lengths: Sequence[int], seconds: Sequence[float]) -> RecomputeLatency:
    from scipy.optimize import curve_fit

    s, t = np.asarray(lengths, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(s) < 4:
        raise ValueError(f"recompute fit needs at least 4 lengths, got {len(s)}")

    def model(x: np.ndarray, a: float, b: float, k: float, e: float) -> np.ndarray:
        return np.asarray(a * x**b + k * x + e)

    p0 = (1e-9, 2.0, float(t.max() / s.max()), float(t.min()))
    (a, b, k, e), _ = curve_fit(
        model, s, t, p0=p0, sigma=np.maximum(t, 1e-9), bounds=((0, 1.0, 0, 0), (np.inf, 3.0, np.inf, np.inf))
    )
    return RecomputeLatency(float(a), float(b), float(k), float(e))


def fit_swap(lengths: Sequence[int], seconds: Sequence[float]) -> SwapLatency:
    if len(lengths) < 2:
        raise ValueError(f"swap fit needs at least 2 lengths, got {len(lengths)}")
    t = np.asarray(seconds, dtype=np.float64)
    # relative error matters, as for the other cost models: weight each sample by 1/t
    gamma, delta = np.polyfit(np.asarray(lengths, dtype=np.float64), t, 1, w=1.0 / np.maximum(t, 1e-9))
    return SwapLatency(max(0.0, float(gamma)), max(0.0, float(delta)))


def sweet_spot(recompute: RecomputeLatency, swap: SwapLatency, max_len: int) -> int | None:
    """The shortest length in [1, max_len] from which swapping is no slower than recomputing, or None.

    Scans for the first length where L_s ≤ L_r and stays so up to ``max_len`` (recompute outgrows any
    line eventually; below the crossing a constant swap overhead dominates).
    """
    grid = np.unique(np.geomspace(1, max(1, max_len), num=512).astype(np.int64))
    swap_wins = np.array([swap(float(s)) <= recompute(float(s)) for s in grid])
    if not swap_wins[-1]:
        return None
    losing = np.flatnonzero(~swap_wins)
    lo = int(grid[losing[-1]]) if len(losing) else 0
    hi = int(grid[losing[-1] + 1]) if len(losing) else int(grid[0])
    while hi - lo > 1:  # bisect between the last losing and first winning grid point
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if swap(mid) <= recompute(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class PreemptionCosts:
    """A profiled pair of latency models and their sweet spot, as saved by the profiling benchmark."""

    recompute: RecomputeLatency
    swap: SwapLatency
    sweet_spot: int | None
    hardware: str = ""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> PreemptionCosts:
        try:
            data = json.loads(path.read_text())
            return cls(
                RecomputeLatency(**data["recompute"]),
                SwapLatency(**data["swap"]),
                data["sweet_spot"],
                data.get("hardware", ""),
            )
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"preemption cost profile {path}: {exc}") from None


class PreemptionStrategy:
    """``choose(context) -> "swap" | "recompute"`` by the mode, and for ``auto`` the sweet spot."""

    def __init__(self, mode: Mode = "recompute", costs: PreemptionCosts | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"decode.preemption.mode: unknown {mode!r}; known: {list(MODES)}")
        if mode == "auto" and costs is None:
            raise ValueError("decode.preemption.mode=auto needs a swap/recompute profile (decode.preemption.profile)")
        self.mode: Mode = mode
        self.threshold = math.inf
        if mode == "swap":
            self.threshold = 0
        elif costs is not None and mode == "auto" and costs.sweet_spot is not None:
            self.threshold = costs.sweet_spot

    def choose(self, context: int) -> Literal["swap", "recompute"]:
        return "swap" if context >= self.threshold else "recompute"
