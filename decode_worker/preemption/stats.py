"""What preemption cost on one decode engine (CacheOpt Fig. 7): how often, by which means, for how long."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass
class PreemptionStats:
    """What preemption cost: how often, by which means, and how long requests stayed out (CacheOpt Fig. 7)."""

    count: int = 0
    swapped: int = 0
    recomputed: int = 0
    durations_s: list[float] = field(default_factory=list)  # preemption → decoding again, one per preemption

    def tail_s(self, q: float = 0.99) -> float:
        d = sorted(self.durations_s)
        return d[min(len(d) - 1, math.ceil(q * len(d)) - 1)] if d else 0.0

    def summary(self) -> dict[str, str]:
        d = self.durations_s
        return {
            "preemptions": str(self.count),
            "swapped": str(self.swapped),
            "recomputed": str(self.recomputed),
            "preemption_median_ms": f"{statistics.median(d) * 1e3:.1f}" if d else "-",
            "preemption_p99_ms": f"{self.tail_s() * 1e3:.1f}" if d else "-",
        }
