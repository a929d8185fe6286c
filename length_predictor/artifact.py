"""The trained heads on disk: ``heads-g<g>.safetensors`` + ``heads-g<g>.json`` (never the encoder).

    heads-g200.json
      format, encoder {name, package, max_length, dir?}, buckets {granularity, open_from, num_buckets},
      heads (HeadsConfig), widths {under[K], over[K], quantile}, padding {alpha, beta, window_s},
      labels {source, target_tokenizer, stats}, data {pairs, splits}, train (TrainConfig), metrics
    heads-g200.safetensors
      the LengthHeads state dict (float32, ~0.4 MB)

``encoder.dir`` is set only by the full fine-tuning path, whose encoder weights are
too big to commit: it points at a directory under ``$TETRISERVE_HOME``. Without it
the encoder is the packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from tetriserve.length_predictor.buckets import BucketSpec
from tetriserve.length_predictor.heads import HeadsConfig, HeadsConfigDict, LengthHeads
from tetriserve.length_predictor.padding import BucketWidths, PaddingParams

FORMAT = 1


class EncoderMeta(TypedDict, total=False):
    name: str
    package: str
    max_length: int
    dir: str  # a fine-tuned encoder's weights (the full fine-tuning path only)


class BucketsMeta(TypedDict):
    granularity: int
    open_from: int
    num_buckets: int


class WidthsMeta(TypedDict, total=False):
    under: list[float]
    over: list[float]
    quantile: float
    fitted_on: str


class PaddingMeta(TypedDict, total=False):
    alpha: float
    beta: float
    window_s: float


class LabelsMeta(TypedDict, total=False):
    source: str
    target_tokenizer: str
    train_stats: dict[str, float]


class DataMeta(TypedDict, total=False):
    pairs_file: str
    pairs_path: str | None
    limit: int | None
    splits: dict[str, int]
    split_salt: str


class ArtifactMeta(TypedDict, total=False):
    """The artifact's JSON (the module docstring's layout); a key of its own that a caller adds is kept."""

    format: int
    encoder: EncoderMeta
    buckets: BucketsMeta
    heads: HeadsConfigDict
    widths: WidthsMeta
    padding: PaddingMeta
    labels: LabelsMeta
    data: DataMeta
    train: dict[str, object]
    metrics: dict[str, float]


def _no_meta() -> ArtifactMeta:
    return {}


@dataclass
class Artifact:
    """Everything the served predictor needs besides the encoder weights."""

    heads: LengthHeads
    spec: BucketSpec
    widths: BucketWidths
    padding: PaddingParams = field(default_factory=PaddingParams)
    meta: ArtifactMeta = field(default_factory=_no_meta)

    @property
    def max_length(self) -> int:
        return int(self.meta.get("encoder", {}).get("max_length", 256))

    @property
    def encoder_dir(self) -> str | None:
        value = self.meta.get("encoder", {}).get("dir")
        return str(value) if value else None


def weights_path(json_path: str | os.PathLike[str]) -> Path:
    return Path(json_path).with_suffix(".safetensors")


def save(art: Artifact, json_path: str | os.PathLike[str]) -> Path:
    """Write the JSON and the safetensors beside it; returns the JSON path."""
    from safetensors.torch import save_file

    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in art.heads.state_dict().items()}
    save_file(state, str(weights_path(path)))
    meta: ArtifactMeta = {
        **art.meta,
        "format": FORMAT,
        "buckets": {
            "granularity": art.spec.granularity,
            "open_from": art.spec.open_from,
            "num_buckets": art.spec.num_buckets,
        },
        "heads": art.heads.heads_config.to_dict(),
        "widths": {**art.meta.get("widths", {}), "under": list(art.widths.under), "over": list(art.widths.over)},
        "padding": {"alpha": art.padding.alpha, "beta": art.padding.beta, "window_s": art.padding.window_s},
    }
    path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def load(json_path: str | os.PathLike[str], device: str = "cpu") -> Artifact:
    from safetensors.torch import load_file

    path = Path(json_path)
    meta: ArtifactMeta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT}, got {meta.get('format')!r}")
    b = meta["buckets"]
    spec = BucketSpec(int(b["granularity"]), int(b["open_from"]))
    heads = LengthHeads(HeadsConfig(**meta["heads"]))
    heads.load_state_dict(load_file(str(weights_path(path)), device=device))
    heads.to(device).eval()
    widths = BucketWidths(tuple(meta["widths"]["under"]), tuple(meta["widths"]["over"]))
    if len(widths.under) != spec.num_buckets or heads.heads_config.num_buckets != spec.num_buckets:
        raise ValueError(f"{path}: widths/heads do not match {spec.num_buckets} buckets")
    p = meta.get("padding", {})
    padding = PaddingParams(alpha=p.get("alpha", 0.95), beta=p.get("beta", 0.01), window_s=p.get("window_s", 10.0))
    return Artifact(heads, spec, widths, padding, meta)


def export(src_json: str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> list[Path]:
    """Copy a trained artifact (JSON + safetensors) into ``dst_dir`` (the committed artifacts folder)."""
    src = Path(src_json)
    load(src)  # refuse to export something that does not load
    out = Path(dst_dir)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for f in (src, weights_path(src)):
        shutil.copyfile(f, out / f.name)
        copied.append(out / f.name)
    return copied
