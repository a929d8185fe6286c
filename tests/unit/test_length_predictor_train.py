"""Training: fast mode on synthetic features, the artifact round trip, and a full fine-tuning smoke test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tetriserve.length_predictor import artifact as art_io
from tetriserve.length_predictor.encoder import FEATURE_DIM
from tetriserve.length_predictor.train import TrainConfig, predict_arrays, train_heads


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features whose first 16 coordinates say short (~50 tokens) or long (~700 tokens) answers."""
    rng = np.random.default_rng(seed)
    long = rng.random(n) < 0.5
    x = rng.normal(size=(n, FEATURE_DIM)).astype(np.float32)
    x[:, :16] += np.where(long, 1.5, -1.5)[:, None]
    y = np.where(long, rng.integers(600, 800, n), rng.integers(20, 80, n)).astype(np.float64)
    return x, y


def test_fast_mode_learns_and_round_trips(tmp_path: Path) -> None:
    tx, ty = synthetic(512, 0)
    vx, vy = synthetic(128, 1)
    cfg = TrainConfig(
        granularity=200, epochs=4, direction_epochs=1, batch_size=64, learning_rate=5e-3, hidden=32, progress=False
    )
    result = train_heads(tx, ty, vx, vy, cfg)
    assert result.metrics["val_accuracy"] > 0.8  # the separable signal is found
    assert len(result.widths.under) == result.spec.num_buckets == 11
    path = art_io.save(art_io.Artifact(result.heads, result.spec, result.widths, meta={"x": 1}), tmp_path / "h.json")
    assert art_io.weights_path(path).stat().st_size < 200_000
    loaded = art_io.load(path)
    before, after = predict_arrays(result.heads, vx), predict_arrays(loaded.heads, vx)
    np.testing.assert_array_equal(before["bucket"], after["bucket"])
    np.testing.assert_allclose(before["length"], after["length"], rtol=1e-5)
    assert loaded.widths == result.widths and loaded.meta["x"] == 1
    copied = art_io.export(path, tmp_path / "exported")
    assert sorted(p.name for p in copied) == ["h.json", "h.safetensors"]


def test_artifact_format_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 99}')
    with pytest.raises(ValueError, match="format"):
        art_io.load(bad)


def test_full_finetuning_smoke(tmp_path: Path) -> None:
    """The GPU path runs end to end on CPU on a handful of examples (2 optimizer steps)."""
    from tetriserve.length_predictor.finetune import finetune_full

    prompts = [f"question number {i}: " + "please explain " * (i % 5) for i in range(8)]
    lens = [len(p.split()) for p in prompts]
    y = np.array([30.0, 500.0] * 4)
    cfg = TrainConfig(granularity=400, epochs=1, direction_epochs=1, batch_size=4, progress=False)
    torch.set_num_threads(2)
    result, enc_dir = finetune_full(
        (prompts, lens, y), (prompts[:4], lens[:4], y[:4]), cfg, tmp_path, max_length=16, max_steps=2
    )
    assert (enc_dir / "config.json").is_file() and (enc_dir / "tokenizer.json").is_file()
    assert result.spec.num_buckets == 6 and len(result.widths.over) == 6
