"""``tetriserve predictor train | eval | export``: the workflow of TetriInfer Fig. 8 on this machine.

train   pairs (data.py, built once per target tokenizer) ─▶ first --limit pairs ─▶ splits
        fast: cached MiniLM embeddings per split ─▶ train.train_heads     (CPU: minutes)
        full: finetune.finetune_full (GPU)
        ─▶ $TETRISERVE_HOME/predictor/runs/g<g>/heads-g<g>.json (+ .safetensors), one per granularity
eval    each artifact on the TEST split (never seen in training or width fitting), beside the
        majority-bucket and prompt-length-only baselines ─▶ report.py: markdown + PNGs
export  runs/g<g>/heads-g<g>.* ─▶ length_predictor/artifacts/ (committed; the encoder never is)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tetriserve.length_predictor import artifact as art_io
from tetriserve.length_predictor.data import (
    SPLIT_SALT,
    Pair,
    build_pairs,
    by_split,
    label_stats,
    read_pairs,
    tokenizer_counter,
)
from tetriserve.length_predictor.embed_cache import cached_embeddings
from tetriserve.length_predictor.encoder import ENCODER_NAME, ENCODER_PACKAGE, features
from tetriserve.length_predictor.paths import ARTIFACTS_DIR, artifact_stem, predictor_home, run_dir
from tetriserve.length_predictor.train import TrainConfig, TrainedHeads, train_heads

if TYPE_CHECKING:
    from tetriserve.length_predictor.report import EvalSummary

logger = logging.getLogger(__name__)
LABEL_SOURCE = "ShareGPT gpt turn (ChatGPT's answer), counted in the target tokenizer"


@dataclass(frozen=True)
class DataOptions:
    """Which pairs: labelled with ``target_tokenizer``, the first ``limit`` of them (None: all)."""

    target_tokenizer: str
    limit: int | None = None
    pairs_file: str | None = None  # an explicit pairs JSONL (e.g. written by labeling.py)

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 10:
            raise ValueError(f"limit must be >= 10 pairs, got {self.limit}")


def pairs_file(opts: DataOptions) -> Path:
    if opts.pairs_file:
        return Path(opts.pairs_file)
    return predictor_home() / "data" / f"pairs-sharegpt-{Path(opts.target_tokenizer).name}.jsonl"


def load_pairs(opts: DataOptions, progress: bool = True) -> list[Pair]:
    path = pairs_file(opts)
    if not path.is_file():
        if opts.pairs_file:
            raise FileNotFoundError(f"pairs file {path} not found")
        logger.info("building (prompt, response length) pairs with the tokenizer of %s", opts.target_tokenizer)
        build_pairs(path, tokenizer_counter(opts.target_tokenizer), progress=progress)
    pairs = read_pairs(path)
    return pairs[: opts.limit] if opts.limit is not None else pairs


def split_xy(pairs: Sequence[Pair], progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Features (cached embeddings ⊕ length) and labels of one split."""
    emb = cached_embeddings([p.prompt for p in pairs], progress=progress)
    return features(emb, [p.prompt_len for p in pairs]), np.asarray([p.response_len for p in pairs], dtype=np.float64)


def _meta(
    opts: DataOptions, pairs: list[Pair], result: TrainedHeads, mode: str, seconds: float
) -> art_io.ArtifactMeta:
    splits = by_split(pairs)
    return {
        "encoder": {"name": ENCODER_NAME, "package": f"{ENCODER_PACKAGE}==0.1.0", "max_length": 256},
        "labels": {
            "source": pairs[0].source if pairs and pairs[0].source != "sharegpt" else LABEL_SOURCE,
            "target_tokenizer": Path(opts.target_tokenizer).name,
            "train_stats": label_stats(splits["train"]),
        },
        "data": {
            "pairs_file": pairs_file(opts).name,
            "pairs_path": opts.pairs_file,
            "limit": opts.limit,
            "splits": {k: len(v) for k, v in splits.items()},
            "split_salt": SPLIT_SALT,
        },
        "train": {**vars(result.config), "mode": mode, "seconds": round(seconds, 1)},
        "metrics": result.metrics,
        "widths": {"quantile": result.config.width_quantile, "fitted_on": "val"},
    }


def train(
    granularities: Sequence[int], opts: DataOptions, cfg: TrainConfig, mode: str = "fast", max_steps: int = -1
) -> list[Path]:
    """Train one artifact per granularity into ``runs/g<g>/``; returns the JSON paths."""
    if mode not in ("fast", "full"):
        raise ValueError(f"mode must be fast or full, got {mode!r}")
    pairs = load_pairs(opts, cfg.progress)
    splits = by_split(pairs)
    logger.info("pairs: %s", {k: len(v) for k, v in splits.items()})
    if min(len(splits["train"]), len(splits["val"])) == 0:
        raise ValueError(f"limit={opts.limit} leaves an empty train or val split")
    if mode == "fast":
        tx, ty = split_xy(splits["train"], cfg.progress)
        vx, vy = split_xy(splits["val"], cfg.progress)
    out: list[Path] = []
    for g in granularities:
        gcfg = replace(cfg, granularity=g)
        t0 = time.perf_counter()
        encoder_dir = None
        if mode == "fast":
            result = train_heads(tx, ty, vx, vy, gcfg)
        else:
            from tetriserve.length_predictor.finetune import finetune_full

            def cols(ps: list[Pair]) -> tuple[list[str], list[int], np.ndarray]:
                return [p.prompt for p in ps], [p.prompt_len for p in ps], np.asarray([p.response_len for p in ps])

            result, encoder_dir = finetune_full(
                cols(splits["train"]), cols(splits["val"]), gcfg, run_dir(g), max_steps=max_steps
            )
        meta = _meta(opts, pairs, result, mode, time.perf_counter() - t0)
        if encoder_dir is not None:
            meta["encoder"]["dir"] = str(encoder_dir)
        path = run_dir(g) / f"{artifact_stem(g)}.json"
        art_io.save(art_io.Artifact(result.heads, result.spec, result.widths, meta=meta), path)
        logger.info("g=%s: %s -> %s", g, result.metrics, path)
        out.append(path)
    return out


def export(granularities: Sequence[int], dst: str | Path = ARTIFACTS_DIR) -> list[Path]:
    copied: list[Path] = []
    for g in granularities:
        src = run_dir(g) / f"{artifact_stem(g)}.json"
        if not src.is_file():
            raise FileNotFoundError(f"no trained heads at {src}; run `tetriserve predictor train --granularity {g}`")
        if art_io.load(src).encoder_dir:
            raise ValueError(
                f"{src} uses a fine-tuned encoder, whose weights are not committed; export fast-mode heads"
            )
        copied += art_io.export(src, dst)
    return copied


def evaluate(
    artifact_paths: Sequence[str | Path], target_tokenizer: str, out_dir: str | Path, progress: bool = True
) -> Path:
    """Evaluate each artifact on the test split of the pairs it was trained on; write the report."""
    from tetriserve.length_predictor.report import evaluate_one, write_report

    results = []
    summary: EvalSummary = {}
    for path in artifact_paths:
        art = art_io.load(path)
        data = art.meta.get("data", {})
        opts = DataOptions(target_tokenizer, data.get("limit"), data.get("pairs_path"))
        pairs = load_pairs(opts, progress)
        splits = by_split(pairs)
        test_x, test_y = split_xy(splits["test"], progress)
        results.append(evaluate_one(art, splits["train"], splits["test"], test_x, test_y))
        summary = {
            "meta": art.meta,
            "splits": {k: len(v) for k, v in splits.items()},
            "test_stats": label_stats(splits["test"]),
        }
    return write_report(results, summary, Path(out_dir))
