"""SOLA eq. 3–5 cost models (common.cost_model) and the cost profile file (common.cost_profile)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tetriserve.common.cost_model import (
    DecodeCost,
    OnlineCorrection,
    PrefillCost,
    fit_decode,
    fit_prefill,
    mean_abs_pct_error,
    prefill_features,
)
from tetriserve.common.cost_profile import CostProfile, SweepPoint, default_profile_path, find_pivot, find_tile

PREFILL = PrefillCost(a0=2e-9, b0=1.5e-8, c0=4e-5, d0=4e-3)
DECODE = DecodeCost(a1=5e-5, b1=2e-8, c1=4e-3)


def _prefill_batches(n: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    rng = random.Random(seed)
    return [
        [(rng.choice([0, 0, 256, 1024]), rng.randint(16, 2048)) for _ in range(rng.randint(1, 4))] for _ in range(n)
    ]


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def test_prefill_features_and_predict() -> None:
    batch = [(0, 100), (50, 10)]
    assert prefill_features(batch) == (500.0, 10100.0, 110.0)
    assert PREFILL.predict(batch) == pytest.approx(2e-9 * 500 + 1.5e-8 * 10100 + 4e-5 * 110 + 4e-3)
    assert PREFILL.predict([]) == 0.0
    assert DECODE.predict([100, 300]) == pytest.approx(5e-5 * 2 + 2e-8 * 400 + 4e-3)
    assert DECODE.predict([]) == 0.0


def test_fit_prefill_recovers_coefficients() -> None:
    samples = [(b, PREFILL.predict(b)) for b in _prefill_batches(80)]
    fitted = fit_prefill(samples)
    for name in ("a0", "b0", "c0", "d0"):
        assert _close(getattr(fitted, name), getattr(PREFILL, name), 1e-3), name
    assert mean_abs_pct_error([fitted.predict(b) for b, _ in samples], [t for _, t in samples]) < 1e-4


def test_fit_prefill_with_noise_is_close() -> None:
    rng = random.Random(1)
    samples = [(b, PREFILL.predict(b) * (1 + rng.gauss(0, 0.02))) for b in _prefill_batches(200, seed=2)]
    fitted = fit_prefill(samples)
    assert _close(fitted.c0, PREFILL.c0, 0.05) and _close(fitted.d0, PREFILL.d0, 0.05)
    assert mean_abs_pct_error([fitted.predict(b) for b, _ in samples], [t for _, t in samples]) < 0.03


def test_fit_prefill_unseen_feature_gets_zero_not_the_initial_guess() -> None:
    # no chunked iteration: Σ l_has·l_in is 0 everywhere, so a0 is unidentifiable and must not be left at p0
    samples = [([(0, n)], PREFILL.predict([(0, n)])) for n in range(16, 2048, 64)]
    fitted = fit_prefill(samples)
    assert fitted.a0 == 0.0
    assert _close(fitted.b0, PREFILL.b0, 1e-3) and _close(fitted.c0, PREFILL.c0, 1e-3)


def test_fit_decode_recovers_coefficients() -> None:
    rng = random.Random(3)
    samples = []
    for _ in range(60):
        ctx = [rng.randint(16, 2000) for _ in range(rng.choice([1, 2, 4, 8, 16, 32]))]
        samples.append((ctx, DECODE.predict(ctx)))
    fitted = fit_decode(samples)
    for name in ("a1", "b1", "c1"):
        assert _close(getattr(fitted, name), getattr(DECODE, name), 1e-3), name


def test_fit_needs_enough_samples() -> None:
    with pytest.raises(ValueError, match="at least"):
        fit_prefill([])
    with pytest.raises(ValueError, match="at least 3 samples"):
        fit_decode([([10, 20], 0.01)])


def test_request_time_sums_chunks() -> None:
    # 1000 tokens after 200 computed, chunks of 300: (200,300) (500,300) (800,300) (1100,100)
    expected = sum(PREFILL.predict([(h, n)]) for h, n in [(200, 300), (500, 300), (800, 300), (1100, 100)])
    assert PREFILL.request_time(200, 1000, chunk=300) == pytest.approx(expected)
    assert PREFILL.request_time(0, 1000) == pytest.approx(PREFILL.predict([(0, 1000)]))
    assert PREFILL.request_time(0, 1000, chunk=0) == pytest.approx(PREFILL.predict([(0, 1000)]))
    assert PREFILL.request_time(10, 0, chunk=64) == 0.0
    # chunking costs the per-iteration constant d0 once per chunk
    assert PREFILL.request_time(0, 1024, chunk=256) > PREFILL.request_time(0, 1024)


def test_scaled() -> None:
    assert PREFILL.scaled(2.0).predict([(10, 20)]) == pytest.approx(2 * PREFILL.predict([(10, 20)]))
    assert DECODE.scaled(0.5).predict([100]) == pytest.approx(0.5 * DECODE.predict([100]))


def test_mean_abs_pct_error() -> None:
    assert mean_abs_pct_error([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert math.isnan(mean_abs_pct_error([1.0], [0.0]))
    with pytest.raises(ValueError):
        mean_abs_pct_error([1.0, 2.0], [1.0])


def test_online_correction_converges_to_ratio() -> None:
    corr = OnlineCorrection(alpha=0.3)
    assert corr.gamma == 1.0
    for _ in range(60):
        corr.observe(base_prediction=0.010, measured=0.013)
    assert corr.gamma == pytest.approx(1.3, rel=1e-6)
    first = OnlineCorrection(alpha=0.5).observe(0.010, 0.020)
    assert first == pytest.approx(0.5 * 2.0 + 0.5 * 1.0)  # eq. 5 by hand
    assert corr.observe(0.0, 0.5) == corr.gamma  # nothing to learn from a zero prediction


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, math.nan])
def test_online_correction_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        OnlineCorrection(alpha=alpha)


def test_find_pivot_on_saturating_curve() -> None:
    # t(S) = 5 ms + S / 40k tok/s: throughput S / t(S) rises towards 40k; 90% of the best is reached at S=2048
    points = [SweepPoint(s, 0.005 + s / 40_000) for s in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)]
    best = max(p.tokens_per_s for p in points)
    pivot = find_pivot(points, 0.9)
    assert pivot.tokens_per_s >= 0.9 * best
    assert all(p.tokens_per_s < 0.9 * best for p in points if p.forward_tokens < pivot.forward_tokens)
    assert pivot.forward_tokens == 2048
    assert find_pivot(points, 1.0).forward_tokens == 8192
    assert find_pivot(points, 0.5).forward_tokens == 256


def test_find_pivot_validates() -> None:
    with pytest.raises(ValueError, match="empty"):
        find_pivot([])
    with pytest.raises(ValueError, match="saturation"):
        find_pivot([SweepPoint(16, 0.01)], 0.0)


def _profile(**overrides: object) -> CostProfile:
    fields: dict[str, object] = {
        "model": "tiny-llama",
        "hardware": "Some CPU x2-cores",
        "prefill": PREFILL,
        "decode": DECODE,
        "pivot_tokens": 512,
        "pivot_seconds": 0.017,
        "prefill_fit_error": 0.055,
        "decode_fit_error": 0.061,
        "sweep": (SweepPoint(16, 0.005), SweepPoint(512, 0.017)),
    }
    fields.update(overrides)
    return CostProfile(**fields)  # type: ignore[arg-type]


def test_cost_profile_json_round_trip(tmp_path: Path) -> None:
    prof = _profile()
    path = prof.save(tmp_path / "sub" / "p.json")
    assert CostProfile.load(path) == prof


def test_cost_profile_round_trips_its_tile_and_reads_an_old_one_without(tmp_path: Path) -> None:
    prof = _profile(tile_tokens=64)
    assert CostProfile.load(prof.save(tmp_path / "t.json")) == prof
    old = _profile().to_json()
    del old["tile_tokens"]  # a profile written before the tile was measured
    assert CostProfile.from_json(old).tile_tokens is None


def test_find_tile_on_a_staircase_of_64_token_tiles() -> None:
    # a forward of S tokens takes 1 ms per 64-token tile, ⌈S/64⌉ tiles: 16→1, 24→1, 32→1, 48→1, 64→1, 96→2,
    # 128→2, 192→3, 256→4. T = 16, 32: 1.5T and 2T both one tile, equal; T = 64: 96 and 128 both 2 tiles,
    # equal; T = 128: 192 takes 3 ms, 256 takes 4 ms, 3 < 0.95 · 4, so the tile is 64
    sizes = (16, 24, 32, 48, 64, 96, 128, 192, 256)
    sweep = [SweepPoint(s, 1e-3 * math.ceil(s / 64)) for s in sizes]
    assert find_tile(sweep) == 64


def test_find_tile_none_when_time_grows_with_every_token() -> None:
    sweep = [SweepPoint(s, 1e-5 * s) for s in (16, 24, 32, 48, 64)]  # 24 takes 0.75 of 32: no tile
    assert find_tile(sweep) is None


def test_cost_profile_unknown_fit_error_is_json_null(tmp_path: Path) -> None:
    path = _profile(decode_fit_error=math.nan).save(tmp_path / "p.json")
    assert json.loads(path.read_text())["decode_fit_error"] is None  # strict JSON: no NaN literal
    assert math.isnan(CostProfile.load(path).decode_fit_error)


def test_cost_profile_missing_file_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not exist: run `tetriserve profile`"):
        CostProfile.load(tmp_path / "none.json")


def test_cost_profile_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CostProfile.load(bad)
    bad.write_text(json.dumps({"model": "m"}))
    with pytest.raises(ValueError, match="missing or malformed field"):
        CostProfile.load(bad)


def test_default_profile_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TETRISERVE_HOME", str(tmp_path))
    path = default_profile_path("/models/tiny-llama", "NVIDIA H100 80GB HBM3")
    assert path == tmp_path / "profiles" / "tiny-llama--NVIDIA-H100-80GB-HBM3.json"
