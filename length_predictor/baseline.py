"""Baseline predictor: per-prompt-length-bucket quantiles of observed output lengths.

Prompts fall into log2-spaced length buckets (bucket k holds lengths in
[2^k, 2^(k+1))). Each bucket keeps the last ``window`` output lengths seen for
it (seeded from ``fit``, updated online by ``observe``). The estimate is the
bucket's median, the range its [q_low, q_high] quantiles with an exclusive
upper end, capped at ``max_tokens + 1`` so an output that reached
``max_tokens`` is inside. The confidence is the share of the bucket's history
inside the range. A bucket with fewer than ``min_samples`` observations falls
back to all observations, and with none at all to the uninformative range
[0, max_tokens + 1).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence

from tetriserve.common.length import LengthEstimate, PredictInput


def _quantile(sorted_values: Sequence[int], q: float) -> int:
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return int(sorted_values[idx])


class BucketQuantilePredictor:
    name = "bucket-quantile"

    def __init__(self, window: int = 512, q_low: float = 0.1, q_high: float = 0.9, min_samples: int = 8) -> None:
        if not 0.0 <= q_low < 0.5 < q_high <= 1.0:
            raise ValueError(f"need 0 <= q_low < 0.5 < q_high <= 1, got q_low={q_low} q_high={q_high}")
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be >= 1, got window={window} min_samples={min_samples}")
        if min_samples > window:
            raise ValueError(f"min_samples ({min_samples}) must not exceed window ({window})")
        self._window = window
        self._q = (q_low, q_high)
        self._min_samples = min_samples
        self._buckets: dict[int, deque[int]] = {}
        self._all: deque[int] = deque(maxlen=window * 4)
        self._lock = threading.Lock()  # predict runs in a worker thread while observe runs on the event loop

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        del state["_lock"]  # locks do not pickle; Ray ships the predictor to each prefill worker
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @staticmethod
    def bucket_of(prompt_len: int) -> int:
        return max(prompt_len, 1).bit_length() - 1

    def fit(self, pairs: Iterable[tuple[int, int]]) -> None:
        for prompt_len, output_len in pairs:
            self.observe(prompt_len, output_len)

    def observe(self, prompt_len: int, output_len: int) -> None:
        if output_len < 0:
            raise ValueError(f"output_len must be >= 0, got {output_len}")
        with self._lock:
            bucket = self._buckets.setdefault(self.bucket_of(prompt_len), deque(maxlen=self._window))
            bucket.append(output_len)
            self._all.append(output_len)

    def warm_up(self) -> None:
        return None  # nothing to load

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        with self._lock:
            return [self._one(item) for item in batch]

    def instant(self, item: PredictInput) -> LengthEstimate:
        return self.predict([item])[0]  # a few quantiles: as cheap as an estimate gets

    def _one(self, item: PredictInput) -> LengthEstimate:
        cap = max(item.max_tokens, 0)
        bucket = self.bucket_of(item.prompt_len)
        history = self._buckets.get(bucket, ())
        if len(history) < self._min_samples:
            history = self._all
        if not history:
            return LengthEstimate(0, cap // 2, cap + 1, bucket, 0.0, self.name)
        values = sorted(history)
        lo = min(_quantile(values, self._q[0]), cap)
        mid = min(max(_quantile(values, 0.5), lo), cap)
        hi = min(max(_quantile(values, self._q[1]) + 1, mid), cap + 1)
        inside = sum(1 for v in values if lo <= v < hi) / len(values)
        return LengthEstimate(lo, mid, hi, bucket, round(inside, 4), self.name)
