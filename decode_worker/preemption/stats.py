"""What preemption cost on one decode engine (CacheOpt Fig. 7): how often, by which means, for how long."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def tail(xs: Sequence[float], q: float = 0.99) -> float:
    """The ``q`` quantile by rank (the value at rank round(q·n)); 0 for no values."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))] if s else 0.0


@dataclass
class PreemptionStats:
    """What preemption cost: how often, by which means, and how long requests stayed out (CacheOpt Fig. 7)."""

    count: int = 0
    swapped: int = 0
    recomputed: int = 0
    durations_s: list[float] = field(default_factory=list)  # preemption → decoding again, one per preemption

    def tail_s(self, q: float = 0.99) -> float:
        return tail(self.durations_s, q)

    def summary(self) -> dict[str, str]:
        d = self.durations_s
        return {
            "preemptions": str(self.count),
            "swapped": str(self.swapped),
            "recomputed": str(self.recomputed),
            "preemption_median_ms": f"{statistics.median(d) * 1e3:.1f}" if d else "-",
            "preemption_p99_ms": f"{self.tail_s() * 1e3:.1f}" if d else "-",
        }
