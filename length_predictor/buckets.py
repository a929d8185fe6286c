"""Output-length buckets of TetriInfer's classifier (§3.3.2, §5.2.2).

    granularity g, K buckets (K = ceil(open_from / g) + 1):

    bucket:   0        1         2               K-2                 K-1
           [0, g) [g, 2g) [2g, 3g)  ...  [(K-2)g, (K-1)g)  [(K-1)g, ∞)   ← open-ended tail

* Bucket k holds lengths in ``[k·g, (k+1)·g)``; the paper's own example ("0 to
  200 is label 0" at granularity 100) reads as a typo for this.
* The last bucket is **open-ended** rather than capped: every length has a
  label, and no rare 5000-token answer is dropped from training. With the
  default ``open_from = 2000`` (OPT-13B's 2K context, the paper's target) the
  tail starts at 2000 for every granularity: K = 21 / 11 / 6 at g = 100 / 200 / 400.
* When served, a range's exclusive upper end is capped at ``max_tokens + 1``
  (an output that reaches ``max_tokens`` is inside), and the open tail's upper
  end *is* that cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_OPEN_FROM = 2000
GRANULARITIES = (100, 200, 400)


@dataclass(frozen=True)
class BucketSpec:
    """Fixed-width length buckets with an open-ended last bucket.

    Attributes:
        granularity: bucket width in tokens (TetriInfer: 100 / 200 / 400).
        open_from: lengths at or above the last bucket's lower edge ``(K-1)·g`` fall in the
            open-ended last bucket; ``K = ceil(open_from / granularity) + 1``.
    """

    granularity: int
    open_from: int = DEFAULT_OPEN_FROM

    def __post_init__(self) -> None:
        if self.granularity < 1:
            raise ValueError(f"BucketSpec.granularity must be >= 1, got {self.granularity}")
        if self.open_from < self.granularity:
            raise ValueError(f"BucketSpec.open_from must be >= granularity ({self.granularity}), got {self.open_from}")

    @property
    def num_buckets(self) -> int:
        return math.ceil(self.open_from / self.granularity) + 1

    def bucket_of(self, length: int) -> int:
        """Index of the bucket holding ``length`` tokens (negative lengths are a bug)."""
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        return min(length // self.granularity, self.num_buckets - 1)

    def lower(self, bucket: int) -> int:
        self._check(bucket)
        return bucket * self.granularity

    def upper(self, bucket: int) -> int | None:
        """Exclusive upper edge; ``None`` for the open-ended last bucket."""
        self._check(bucket)
        return None if bucket == self.num_buckets - 1 else (bucket + 1) * self.granularity

    def midpoint(self, bucket: int) -> int:
        """A point inside the bucket (the open tail uses lower edge + g/2)."""
        return self.lower(bucket) + self.granularity // 2

    def served_range(self, bucket: int, max_tokens: int) -> tuple[int, int]:
        """``[lower, upper)`` of a bucket for a request capped at ``max_tokens``: upper <= max_tokens + 1."""
        cap = max(max_tokens, 0) + 1
        hi = self.upper(bucket)
        upper = cap if hi is None else min(hi, cap)
        return min(self.lower(bucket), upper - 1), upper

    def _check(self, bucket: int) -> None:
        if not 0 <= bucket < self.num_buckets:
            raise ValueError(f"bucket must be in [0, {self.num_buckets}), got {bucket}")
