"""CacheOpt's confidence padding (eq. 3-4), the arrival-rate meter, width fitting, and the metrics built on them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tetriserve.length_predictor import evaluate as ev
from tetriserve.length_predictor.buckets import BucketSpec
from tetriserve.length_predictor.padding import (
    ArrivalRateMeter,
    BucketWidths,
    PaddingParams,
    confidence_for_rate,
    fit_widths,
    hoeffding_padding,
    padded_estimate,
    padded_length,
)

# ---- eq. 3 against hand-computed values ------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "c", "expected"),
    [
        (100, 0.5, 58.8705),  # sqrt(100^2/2 * ln 2)        = sqrt(5000 * 0.693147) = sqrt(3465.74)
        (100, 0.9, 107.2983),  # sqrt(100^2/2 * ln 10)      = sqrt(5000 * 2.302585) = sqrt(11512.93)
        (200, 0.8, 179.4123),  # sqrt(200^2/2 * ln 5)       = sqrt(20000 * 1.609438) = sqrt(32188.76)
        (50, 0.95, 61.1937),  # sqrt(50^2/2 * ln 20)        = sqrt(1250 * 2.995732) = sqrt(3744.67)
        (0, 0.9, 0.0),
        (100, 0.0, 0.0),
    ],
)
def test_hoeffding_padding_hand_computed(width: float, c: float, expected: float) -> None:
    assert hoeffding_padding(width, c) == pytest.approx(expected, abs=1e-3)


def test_padding_grows_with_confidence_and_bounds_the_tail() -> None:
    pads = [hoeffding_padding(100, c) for c in (0.5, 0.8, 0.9, 0.95, 0.99)]
    assert pads == sorted(pads)
    # eq. 2 at t: exp(-2 t^2 / width^2) == 1 - c
    t = hoeffding_padding(80, 0.9)
    assert math.exp(-2 * t * t / 80**2) == pytest.approx(0.1)


@pytest.mark.parametrize(("width", "c"), [(-1, 0.5), (10, 1.0), (10, -0.1)])
def test_hoeffding_padding_validates(width: float, c: float) -> None:
    with pytest.raises(ValueError):
        hoeffding_padding(width, c)


# ---- eq. 4 and the meter -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "alpha", "beta", "expected"),
    [(0.0, 0.95, 0.01, 0.95), (10.0, 0.9, 0.1, 0.45), (5.0, 0.8, 0.05, 0.64), (100.0, 0.9, 0.01, 0.45)],
)
def test_confidence_for_rate(rate: float, alpha: float, beta: float, expected: float) -> None:
    assert confidence_for_rate(rate, alpha, beta) == pytest.approx(expected)


def test_confidence_falls_as_the_rate_rises() -> None:
    cs = [confidence_for_rate(r, 0.95, 0.05) for r in (0, 1, 5, 20, 100)]
    assert cs == sorted(cs, reverse=True) and cs[0] == 0.95


@pytest.mark.parametrize(("alpha", "beta"), [(0.0, 0.1), (1.0, 0.1), (0.9, 0.0)])
def test_confidence_params_validate(alpha: float, beta: float) -> None:
    with pytest.raises(ValueError):
        confidence_for_rate(1.0, alpha, beta)
    with pytest.raises(ValueError):
        PaddingParams(alpha=alpha, beta=beta)


def test_arrival_rate_meter_sliding_window() -> None:
    meter = ArrivalRateMeter(window_s=10.0)
    assert meter.rate(0.0) == 0.0
    meter.record(0.0)
    meter.record(1.0)
    meter.record(2.0, count=2)
    assert meter.rate(5.0) == pytest.approx(0.4)  # 4 arrivals in (-5, 5]
    assert meter.rate(10.5) == pytest.approx(0.3)  # t=0 left the window (0 <= 0.5)
    assert meter.rate(12.0) == pytest.approx(0.0)  # (2, 12]: t=2 is out too
    with pytest.raises(ValueError):
        ArrivalRateMeter(0)


def test_rate_to_confidence_mapping_through_params() -> None:
    meter = ArrivalRateMeter(window_s=1.0)
    meter.record(100.0, count=20)  # 20 req/s
    params = PaddingParams(alpha=0.9, beta=0.05)
    assert params.confidence(meter.rate(100.0)) == pytest.approx(0.9 / (1 + 0.05 * 20))
    assert PaddingParams(fixed_confidence=0.8).confidence(1000.0) == 0.8


# ---- widths and the served estimate --------------------------------------------------------------


def test_fit_widths_hand_computed() -> None:
    buckets = [0, 0, 0, 1]
    residuals = [10.0, 20.0, -5.0, 7.0]
    w = fit_widths(buckets, residuals, num_buckets=3, quantile=1.0, min_count=1)
    assert w.under == (20.0, 7.0, 20.0)  # bucket 2 has no residuals: global max of positives
    assert w.over == (5.0, 5.0, 5.0)  # bucket 1 has no negative residual: global
    median = fit_widths(buckets, residuals, num_buckets=2, quantile=0.5, min_count=2)
    assert median.under == (15.0, 10.0)  # bucket 0: median of [10, 20]; bucket 1: 1 < min_count -> global median
    with pytest.raises(ValueError):
        fit_widths([0], [1.0, 2.0], 1)


def test_padded_estimate_adds_or_subtracts_by_direction() -> None:
    spec = BucketSpec(200)
    widths = BucketWidths(under=(100.0,) * 11, over=(100.0,) * 11)
    up = padded_estimate(300, True, 1, spec, widths, 0.9, 1000)
    assert (up.lower, up.estimate, up.upper, up.bucket, up.confidence) == (200, 407, 408, 1, 0.9)  # 300 + 107.3
    down = padded_estimate(300, False, 1, spec, widths, 0.9, 1000)
    assert (down.lower, down.estimate, down.upper) == (193, 193, 400)  # 300 - 107.3
    capped = padded_estimate(300, True, 1, spec, widths, 0.9, 350)
    assert (capped.lower, capped.estimate, capped.upper) == (200, 350, 351)
    floor = padded_estimate(20, False, 0, spec, widths, 0.9, 1000)
    assert floor.estimate == 0 and floor.lower == 0
    assert padded_length(300, True, 100, 0.0) == 300


def test_vectorised_padding_matches_the_scalar_one() -> None:
    rng = np.random.default_rng(0)
    widths = BucketWidths(tuple(rng.uniform(0, 300, 6)), tuple(rng.uniform(0, 300, 6)))
    length = rng.uniform(0, 2000, 200)
    under = rng.random(200) < 0.5
    bucket = rng.integers(0, 6, 200)
    for c in (0.8, 0.9, 0.95):
        vec = ev.padded_lengths(length, under, bucket, widths, c)
        scalar = [
            padded_length(x, bool(u), widths.width(int(b), bool(u)), c)
            for x, u, b in zip(length, under, bucket, strict=True)
        ]
        np.testing.assert_array_equal(vec, scalar)


# ---- metrics ---------------------------------------------------------------------------------------------


def test_provisioning_counts_and_deviations() -> None:
    p = ev.provisioning(np.array([100, 200, 300, 400]), np.array([150, 200, 250, 300]))
    assert p["under_rate"] == 0.5 and p["over_rate"] == 0.25
    assert p["mean_deviation"] == pytest.approx((50 + 0 + 50 + 100) / 4)
    assert p["mean_under_deviation"] == pytest.approx(75) and p["mean_over_deviation"] == pytest.approx(50)


def test_baselines_hand_computed() -> None:
    train_b = np.array([0, 0, 1, 2, 2, 2])
    assert ev.majority_baseline(train_b, 3).tolist() == [2, 2, 2]
    train_pl = np.array([3, 3, 100, 100, 100, 5000])  # log2 bins 1, 1, 6, 6, 6, 12
    pred = ev.prompt_length_baseline(train_pl, train_b, np.array([2, 120, 6000, 1 << 20]))
    assert pred.tolist() == [0, 2, 2, 2]  # bin 1 -> 0; bin 6 -> {1, 2, 2} -> 2; bin 12 -> 2; unseen -> majority 2
    assert ev.accuracy(np.array([1, 2]), np.array([1, 1])) == 0.5
    assert ev.within_one(np.array([0, 3]), np.array([1, 1])) == 0.5
    assert ev.confusion(np.array([0, 1, 1]), np.array([0, 0, 1]), 2).tolist() == [[1, 0], [1, 1]]


def test_calibration_perfect_and_overconfident() -> None:
    cal = ev.calibration(np.array([0.95, 0.95, 0.55, 0.55]), np.array([1, 1, 1, 0]))
    assert cal["ece"] == pytest.approx(0.5 * 0.05 + 0.5 * 0.05)
