"""Tests for the baseline output-length predictor (per-prompt-length-bucket quantiles)."""

from __future__ import annotations

import random

import pytest

from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.length_predictor.baseline import BucketQuantilePredictor

try:  # hypothesis is optional: the seeded loop below checks the same invariant without it
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - depends on the environment
    given = None


def one(p: BucketQuantilePredictor, prompt_len: int, max_tokens: int) -> LengthEstimate:
    [estimate] = p.predict([PredictInput(prompt_len, max_tokens)])
    return estimate


def test_empty_history_is_uninformative() -> None:
    p = BucketQuantilePredictor()
    e = one(p, prompt_len=100, max_tokens=256)
    assert (e.lower, e.upper, e.confidence) == (0, 257, 0.0)  # upper is exclusive: max_tokens is inside
    assert e.lower <= e.estimate <= e.upper
    assert e.source == "bucket-quantile" and e.bucket == BucketQuantilePredictor.bucket_of(100)
    assert p.predict([]) == []


@pytest.mark.parametrize(
    ("prompt_len", "bucket"),
    [(0, 0), (1, 0), (2, 1), (3, 1), (15, 3), (16, 4), (31, 4), (32, 5), (1023, 9), (1024, 10)],
)
def test_log2_buckets(prompt_len: int, bucket: int) -> None:
    assert BucketQuantilePredictor.bucket_of(prompt_len) == bucket


def test_estimate_comes_from_the_prompts_bucket() -> None:
    p = BucketQuantilePredictor(min_samples=4)
    p.fit([(20, 10)] * 8 + [(1500, 500)] * 8)  # buckets 4 and 10
    short = one(p, prompt_len=24, max_tokens=1000)
    long = one(p, prompt_len=1100, max_tokens=1000)
    assert (short.lower, short.estimate, short.upper, short.bucket) == (10, 10, 11, 4)
    assert short.confidence == 1.0
    assert (long.lower, long.estimate, long.upper, long.bucket) == (500, 500, 501, 10)


def test_quantiles_of_a_spread_bucket() -> None:
    p = BucketQuantilePredictor(q_low=0.1, q_high=0.9, min_samples=8)
    p.fit((40, n) for n in range(101))  # outputs 0..100 in bucket 5
    e = one(p, prompt_len=50, max_tokens=1000)
    assert (e.lower, e.estimate, e.upper) == (10, 50, 91)
    assert e.confidence == pytest.approx(81 / 101, abs=1e-4)  # outputs 10..90 lie in [10, 91)


def test_sparse_bucket_falls_back_to_all_history() -> None:
    p = BucketQuantilePredictor(min_samples=8)
    p.fit([(20, 10)] * 8 + [(1500, 500)] * 7)  # bucket 10 is one sample short
    e = one(p, prompt_len=1500, max_tokens=1000)
    assert e.bucket == 10
    # all 15 observations: 8 x 10 and 7 x 500 -> median 10, q0.9 = 500
    assert (e.lower, e.estimate, e.upper) == (10, 10, 501)
    p.observe(1500, 500)  # the bucket reaches min_samples and takes over
    assert (one(p, 1500, 1000).lower, one(p, 1500, 1000).upper) == (500, 501)


def test_unseen_bucket_falls_back_to_all_history() -> None:
    p = BucketQuantilePredictor(min_samples=2)
    p.fit([(20, 30)] * 5)
    e = one(p, prompt_len=4000, max_tokens=100)
    assert (e.lower, e.estimate, e.upper, e.confidence) == (30, 30, 31, 1.0)


def test_range_is_capped_by_max_tokens() -> None:
    p = BucketQuantilePredictor(min_samples=1)
    p.fit((20, n) for n in range(100, 200))
    e = one(p, prompt_len=20, max_tokens=120)
    assert e.upper == 121 and e.estimate <= 120 and e.lower <= 120  # exclusive upper end
    tiny = one(p, prompt_len=20, max_tokens=5)
    assert (tiny.lower, tiny.estimate, tiny.upper) == (5, 5, 6)


def test_window_keeps_the_most_recent_outputs() -> None:
    p = BucketQuantilePredictor(window=4, min_samples=4)
    p.fit([(20, 1000)] * 4)
    p.fit([(20, 7)] * 4)  # pushes the old outputs out of the bucket's window
    e = one(p, prompt_len=20, max_tokens=2000)
    assert (e.lower, e.estimate, e.upper) == (7, 7, 8)


def test_observe_rejects_negative_output_len() -> None:
    p = BucketQuantilePredictor()
    with pytest.raises(ValueError, match="output_len"):
        p.observe(10, -1)
    with pytest.raises(ValueError, match="output_len"):
        p.fit([(10, 5), (10, -3)])
    p.observe(10, 0)  # zero is a legal output length


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q_low": 0.5}, "q_low"),
        ({"q_low": -0.1}, "q_low"),
        ({"q_high": 0.5}, "q_high"),
        ({"q_high": 1.1}, "q_high"),
        ({"q_low": 0.6, "q_high": 0.4}, "q_low"),
        ({"window": 0}, "window"),
        ({"min_samples": 0}, "min_samples"),
    ],
)
def test_bad_constructor_args(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BucketQuantilePredictor(**kwargs)  # type: ignore[arg-type]


def _check_invariant(p: BucketQuantilePredictor, prompt_len: int, max_tokens: int) -> None:
    e = one(p, prompt_len, max_tokens)  # LengthEstimate itself raises if the order is broken
    assert 0 <= e.lower <= e.estimate <= max_tokens and e.estimate <= e.upper <= max_tokens + 1
    assert 0.0 <= e.confidence <= 1.0


def test_invariant_holds_on_seeded_random_histories() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        window = rng.randint(1, 64)
        p = BucketQuantilePredictor(
            window=window,
            q_low=rng.choice([0.0, 0.05, 0.1, 0.25, 0.49]),
            q_high=rng.choice([0.51, 0.75, 0.9, 0.99, 1.0]),
            min_samples=rng.randint(1, min(16, window)),
        )
        for _ in range(rng.randint(0, 120)):
            p.observe(rng.randint(0, 5000), int(rng.expovariate(1 / 200)))
        for _ in range(10):
            _check_invariant(p, rng.randint(0, 6000), rng.randint(1, 4096))


if given is not None:

    @settings(max_examples=150, deadline=None, database=None)
    @given(
        history=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), max_size=60),
        prompt_len=st.integers(0, 20_000),
        max_tokens=st.integers(1, 10_000),
        min_samples=st.integers(1, 10),
        q_low=st.floats(0.0, 0.49),
        q_high=st.floats(0.51, 1.0),
    )
    def test_invariant_holds_for_any_history(
        history: list[tuple[int, int]], prompt_len: int, max_tokens: int, min_samples: int, q_low: float, q_high: float
    ) -> None:
        p = BucketQuantilePredictor(window=16, q_low=q_low, q_high=q_high, min_samples=min_samples)
        p.fit(history)
        _check_invariant(p, prompt_len, max_tokens)


def test_confidence_counts_outputs_that_hit_max_tokens() -> None:
    p = BucketQuantilePredictor(min_samples=4)
    p.fit([(20, 100)] * 8)
    e = one(p, prompt_len=20, max_tokens=100)
    assert e.estimate == 100
    assert e.confidence == 1.0


def test_pickles_for_ray_and_keeps_its_history() -> None:
    import pickle

    p = BucketQuantilePredictor(min_samples=1)
    p.fit([(20, 50)] * 4)
    q = pickle.loads(pickle.dumps(p))
    assert one(q, prompt_len=20, max_tokens=100).estimate == 50
    q.observe(20, 60)  # the restored lock works
