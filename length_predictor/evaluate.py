"""Held-out metrics of the predictor and its baselines (pure numpy; ``report.py`` renders them).

accuracy          share of test prompts whose predicted bucket is the true bucket (TetriInfer §5.2.2)
baselines         majority bucket of train; prompt-length-only: the train majority bucket of each
                  log2 prompt-length bin (what the prompt length alone can tell)
calibration       reliability bins of the classifier's top probability vs its accuracy, and the ECE
provisioning      of an estimate E against the actual length X (CacheOpt Fig. 17h):
                  under-provisioned X > E (the request outgrows its reservation),
                  over-provisioned  X < E (reserved but unused), deviation |E - X|
padded estimates  E = X̂ ± t, t = (b-a)[bucket, direction] · sqrt(-ln(1-c)/2)   (padding.py, vectorised)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from tetriserve.length_predictor.padding import BucketWidths


class Calibration(TypedDict):
    """Reliability bins (mean top probability, accuracy, count; NaN for an empty bin) and the ECE."""

    confidence: list[float]
    accuracy: list[float]
    count: list[float]
    ece: float


def accuracy(pred: np.ndarray, true: np.ndarray) -> float:
    return float((np.asarray(pred) == np.asarray(true)).mean()) if len(true) else 0.0


def within_one(pred: np.ndarray, true: np.ndarray) -> float:
    return float((np.abs(np.asarray(pred) - np.asarray(true)) <= 1).mean()) if len(true) else 0.0


def confusion(true: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """Counts [true bucket, predicted bucket]."""
    m = np.zeros((k, k), dtype=np.int64)
    np.add.at(m, (np.asarray(true, dtype=np.int64), np.asarray(pred, dtype=np.int64)), 1)
    return m


def majority_baseline(train_buckets: np.ndarray, n: int) -> np.ndarray:
    return np.full(n, np.bincount(np.asarray(train_buckets, dtype=np.int64)).argmax(), dtype=np.int64)


def _log2_bin(prompt_lens: np.ndarray) -> np.ndarray:
    bins: np.ndarray = np.floor(np.log2(np.maximum(np.asarray(prompt_lens, dtype=np.float64), 1.0))).astype(np.int64)
    return bins


def prompt_length_baseline(
    train_prompt_lens: np.ndarray, train_buckets: np.ndarray, test_prompt_lens: np.ndarray
) -> np.ndarray:
    """Per log2 prompt-length bin, the most frequent train bucket (global majority for unseen bins)."""
    bins = _log2_bin(train_prompt_lens)
    buckets = np.asarray(train_buckets, dtype=np.int64)
    default = int(np.bincount(buckets).argmax())
    table = {int(b): int(np.bincount(buckets[bins == b]).argmax()) for b in np.unique(bins)}
    return np.asarray([table.get(int(b), default) for b in _log2_bin(test_prompt_lens)], dtype=np.int64)


def calibration(top_prob: np.ndarray, correct: np.ndarray, bins: int = 10) -> Calibration:
    """Reliability diagram data and the expected calibration error."""
    top_prob = np.asarray(top_prob, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(top_prob, edges[1:-1]), 0, bins - 1)
    conf, acc, count = [], [], []
    ece = 0.0
    for b in range(bins):
        sel = idx == b
        n = int(sel.sum())
        count.append(float(n))
        conf.append(float(top_prob[sel].mean()) if n else float("nan"))
        acc.append(float(correct[sel].mean()) if n else float("nan"))
        if n:
            ece += n / max(len(top_prob), 1) * abs(conf[-1] - acc[-1])
    return {"confidence": conf, "accuracy": acc, "count": count, "ece": ece}


def provisioning(actual: np.ndarray, estimate: np.ndarray) -> dict[str, float]:
    """Under/over-provisioning rates and deviations of ``estimate`` against ``actual`` lengths."""
    x = np.asarray(actual, dtype=np.float64)
    e = np.asarray(estimate, dtype=np.float64)
    under, over = x > e, x < e
    dev = np.abs(e - x)
    return {
        "under_rate": float(under.mean()),
        "over_rate": float(over.mean()),
        "mean_deviation": float(dev.mean()),
        "mean_under_deviation": float(dev[under].mean()) if under.any() else 0.0,
        "mean_over_deviation": float(dev[over].mean()) if over.any() else 0.0,
    }


def padded_lengths(
    length: np.ndarray, under: np.ndarray, bucket: np.ndarray, widths: BucketWidths, confidence: float
) -> np.ndarray:
    """Vectorised ``padding.padded_length`` (same rounding, floor at 0)."""
    if not 0.0 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0, 1), got {confidence}")
    factor = np.sqrt(-np.log1p(-confidence) / 2.0)
    w_under = np.asarray(widths.under)[np.asarray(bucket, dtype=np.int64)]
    w_over = np.asarray(widths.over)[np.asarray(bucket, dtype=np.int64)]
    up = np.asarray(under, dtype=bool)
    t = np.where(up, w_under, w_over) * factor
    e = np.where(up, np.asarray(length) + t, np.asarray(length) - t)
    return np.maximum(0.0, np.round(e))


def provisioning_table(
    actual: np.ndarray,
    length: np.ndarray,
    under: np.ndarray,
    bucket: np.ndarray,
    widths: BucketWidths,
    granularity: int,
    confidences: Sequence[float] = (0.8, 0.9, 0.95),
) -> dict[str, dict[str, float]]:
    """Provisioning of the padded estimate at each confidence, beside references without Hoeffding padding."""
    rows: dict[str, dict[str, float]] = {
        "regressor, no padding": provisioning(actual, np.round(length)),
        "regressor + 100 (RLP-style)": provisioning(actual, np.round(length) + 100),
        "bucket upper edge (S3-style)": provisioning(actual, (np.asarray(bucket) + 1) * granularity),
    }
    for c in confidences:
        rows[f"Hoeffding padding, c = {c:g}"] = provisioning(actual, padded_lengths(length, under, bucket, widths, c))
    always = np.ones(len(np.asarray(length)), dtype=bool)
    for c in confidences:
        rows[f"Hoeffding, always added, c = {c:g}"] = provisioning(
            actual, padded_lengths(length, always, bucket, widths, c)
        )
    return rows
