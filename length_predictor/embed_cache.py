"""Fast mode's embedding cache: the frozen encoder runs once per prompt, the heads train on the cache.

    pairs ──key = sha1(encoder, max_length, every prompt)──▶ cache/emb-<key>.npy   hit: load (no encoder)
                                                                                     miss: embed, then save

The key covers the prompt texts themselves, so a different subset, order or
relabelling that changes prompts never reuses a stale cache; relabelling that
keeps the prompts (``labeling.py``) reuses it, as it should. The cache lives
under ``$TETRISERVE_HOME/predictor/cache`` and is never committed.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tetriserve.length_predictor.encoder import DEFAULT_MAX_LENGTH, ENCODER_NAME, Encoder
from tetriserve.length_predictor.paths import predictor_home

logger = logging.getLogger(__name__)


def cache_key(prompts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH, encoder: str = ENCODER_NAME) -> str:
    h = hashlib.sha1(f"{encoder}|{max_length}|{len(prompts)}".encode())
    for p in prompts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def cached_embeddings(
    prompts: Sequence[str],
    encoder: Encoder | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> np.ndarray:
    """Mean-pooled embeddings [N, 384] of ``prompts``, from the cache when present."""
    max_length = encoder.max_length if encoder is not None else DEFAULT_MAX_LENGTH
    directory = Path(cache_dir) if cache_dir is not None else predictor_home() / "cache"
    path = directory / f"emb-{cache_key(prompts, max_length)}.npy"
    if path.is_file():
        cached: np.ndarray = np.load(path)
        if cached.shape[0] == len(prompts):
            logger.info("embedding cache hit: %s (%s prompts)", path, len(prompts))
            return cached
        logger.warning(
            "embedding cache %s has %s rows, expected %s: recomputing", path, cached.shape[0], len(prompts)
        )
    enc = encoder or Encoder.load(max_length=max_length)
    logger.info("embedding %s prompts with %s (max %s tokens) -> %s", len(prompts), ENCODER_NAME, max_length, path)
    emb = enc.embed(prompts, batch_size=batch_size, progress=progress)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npy")
    np.save(tmp, emb)
    os.replace(tmp, path)
    return emb
