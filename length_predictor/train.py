"""Fast mode: train the heads on cached, frozen-encoder features with Hugging Face ``Trainer``.

    train split features ─▶ stage 1 (Trainer): bucket CE + length MSE ─┐
                                                                      ├─▶ direction labels on train:
                                                                      │   actual > predicted ? under : over
                            stage 2 (Trainer): direction CE  ◀────────┘
    val split ─▶ predicted bucket, residual actual - predicted ─▶ (b - a) per bucket and side (padding.py)

The result (``TrainedHeads``) is what ``artifact.save`` writes. Both stages show
Trainer's progress bars and log the validation loss each epoch.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, TypedDict, Unpack

import numpy as np
import torch

from tetriserve.length_predictor.buckets import DEFAULT_OPEN_FROM, BucketSpec
from tetriserve.length_predictor.heads import LABEL_NAMES, HeadsConfig, LengthHeads, infer
from tetriserve.length_predictor.padding import BucketWidths, fit_widths

if TYPE_CHECKING:
    from transformers import TrainingArguments

logger = logging.getLogger(__name__)


class TrainingOverrides(TypedDict, total=False):
    """The ``TrainingArguments`` a caller of ``training_args`` may set over this module's choices."""

    learning_rate: float
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    bf16: bool
    max_steps: int


class _TrainingKwargs(TrainingOverrides, total=False):
    output_dir: str
    num_train_epochs: float
    weight_decay: float
    lr_scheduler_type: str
    warmup_steps: float
    eval_strategy: str
    logging_strategy: str
    save_strategy: str
    report_to: str
    disable_tqdm: bool
    label_names: list[str]
    remove_unused_columns: bool
    dataloader_num_workers: int
    seed: int
    use_cpu: bool


@dataclass(frozen=True)
class TrainConfig:
    """Fast-mode hyper-parameters (also the full fine-tuning path's head settings)."""

    granularity: int = 200
    open_from: int = DEFAULT_OPEN_FROM
    epochs: int = 4  # frozen-encoder heads overfit after ~3 epochs (val loss rises; chosen on val)
    direction_epochs: int = 3
    batch_size: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    hidden: int = 256
    reg_hidden: int = 64
    dropout: float = 0.3
    reg_weight: float = 1.0
    width_quantile: float = 0.9
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("epochs", "direction_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}")


@dataclass
class TrainedHeads:
    heads: LengthHeads
    spec: BucketSpec
    widths: BucketWidths
    metrics: dict[str, float] = field(default_factory=dict)
    config: TrainConfig = field(default_factory=TrainConfig)


class FeatureDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Rows of (features, bucket label, length label, direction label) for ``Trainer``."""

    def __init__(self, x: np.ndarray, lengths: np.ndarray, spec: BucketSpec, direction: np.ndarray | None = None):
        if len(x) != len(lengths):
            raise ValueError(f"features ({len(x)}) and lengths ({len(lengths)}) differ in length")
        self.x = torch.as_tensor(x, dtype=torch.float32)
        self.lengths = torch.as_tensor(lengths, dtype=torch.float32)
        self.buckets = torch.as_tensor([spec.bucket_of(int(v)) for v in lengths], dtype=torch.long)
        d = direction if direction is not None else np.zeros(len(x), dtype=np.int64)
        self.direction = torch.as_tensor(d, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "features": self.x[i],
            "bucket_labels": self.buckets[i],
            "length_labels": self.lengths[i],
            "direction_labels": self.direction[i],
        }


def training_args(
    out_dir: str, cfg: TrainConfig, epochs: int, **overrides: Unpack[TrainingOverrides]
) -> TrainingArguments:
    from transformers import TrainingArguments

    kwargs: _TrainingKwargs = {
        "output_dir": out_dir,
        "num_train_epochs": epochs,
        "per_device_train_batch_size": cfg.batch_size,
        "per_device_eval_batch_size": 1024,
        "learning_rate": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 20,
        "eval_strategy": "epoch",
        "logging_strategy": "epoch",
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": not cfg.progress,
        "label_names": LABEL_NAMES,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "seed": cfg.seed,
        "use_cpu": not torch.cuda.is_available(),
    }
    merged: _TrainingKwargs = {**kwargs, **overrides}
    return TrainingArguments(**merged)


def _fit(model: torch.nn.Module, args: TrainingArguments, train: FeatureDataset, val: FeatureDataset) -> None:
    from transformers import Trainer

    Trainer(model=model, args=args, train_dataset=train, eval_dataset=val).train()
    model.eval()


def predict_arrays(heads: LengthHeads, x: np.ndarray, batch: int = 4096) -> dict[str, np.ndarray]:
    """Bucket argmax, its probability, the full distribution, regressed length and direction for every row."""
    heads.eval()
    device = next(heads.parameters()).device
    parts: dict[str, list[np.ndarray]] = {"bucket": [], "prob": [], "length": [], "under": [], "probs": []}
    for start in range(0, len(x), batch):
        feats = torch.as_tensor(x[start : start + batch], dtype=torch.float32, device=device)
        out = infer(heads, feats)
        with torch.inference_mode():
            probs = heads(feats)["bucket_logits"].softmax(-1).cpu().numpy()
        parts["bucket"].append(np.asarray(out.bucket))
        parts["prob"].append(np.asarray(out.bucket_prob))
        parts["length"].append(np.asarray(out.length))
        parts["under"].append(np.asarray(out.under))
        parts["probs"].append(probs)
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}


def new_heads(in_dim: int, cfg: TrainConfig, train_y: np.ndarray | None = None) -> tuple[LengthHeads, BucketSpec]:
    """Fresh heads; the regressor's bias starts at the mean log1p length of ``train_y`` (else the MSE swamps CE)."""
    from transformers import set_seed

    set_seed(cfg.seed)
    spec = BucketSpec(cfg.granularity, cfg.open_from)
    config = HeadsConfig(in_dim, spec.num_buckets, cfg.hidden, cfg.reg_hidden, cfg.dropout, cfg.reg_weight)
    heads = LengthHeads(config)
    if train_y is not None and len(train_y):
        with torch.no_grad():
            heads.reg_out.bias.fill_(float(np.log1p(np.asarray(train_y, dtype=np.float64)).mean()))
    return heads, spec


def train_heads(
    train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray, cfg: TrainConfig
) -> TrainedHeads:
    """Both stages on features (``encoder.features``) and response lengths; widths fitted on val."""
    heads, spec = new_heads(train_x.shape[1], cfg, train_y)
    logger.info("stage 1: bucket classifier (g=%s, K=%s) + length regressor", spec.granularity, spec.num_buckets)
    heads.set_stage(1)
    with tempfile.TemporaryDirectory(prefix="tetriserve-heads-") as tmp:
        args = training_args(tmp, cfg, cfg.epochs)
        _fit(heads, args, FeatureDataset(train_x, train_y, spec), FeatureDataset(val_x, val_y, spec))
    return finish_heads(heads, spec, train_x, train_y, val_x, val_y, cfg)


def finish_heads(
    heads: LengthHeads,
    spec: BucketSpec,
    train_x: np.ndarray,
    train_y: np.ndarray,
    val_x: np.ndarray,
    val_y: np.ndarray,
    cfg: TrainConfig,
) -> TrainedHeads:
    """Stage 2 (direction, from stage 1's own errors) and the per-bucket widths on val."""
    train_dir = _directions(heads, train_x, train_y)
    val_dir = _directions(heads, val_x, val_y)
    logger.info("stage 2: deviation direction (train: %.1f%% under-predicted)", 100 * train_dir.mean())
    heads.set_stage(2)
    with tempfile.TemporaryDirectory(prefix="tetriserve-heads-") as tmp:
        args = training_args(tmp, cfg, cfg.direction_epochs)
        train_ds = FeatureDataset(train_x, train_y, spec, train_dir)
        _fit(heads, args, train_ds, FeatureDataset(val_x, val_y, spec, val_dir))
    heads.set_stage(1)
    val = predict_arrays(heads, val_x)
    residuals = (val_y - val["length"]).tolist()
    widths = fit_widths(val["bucket"].tolist(), residuals, spec.num_buckets, quantile=cfg.width_quantile)
    val_buckets = np.asarray([spec.bucket_of(int(v)) for v in val_y])
    metrics = {
        "val_accuracy": float((val["bucket"] == val_buckets).mean()),
        "val_direction_accuracy": float((val["under"] == (val_dir == 1)).mean()),
        "val_mae_tokens": float(np.abs(val_y - val["length"]).mean()),
    }
    logger.info("validation: %s", metrics)
    return TrainedHeads(heads, spec, widths, metrics, cfg)


def _directions(heads: LengthHeads, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """1 where the regressor under-predicts (actual > predicted), else 0."""
    return (y > predict_arrays(heads, x)["length"]).astype(np.int64)


def config_dict(cfg: TrainConfig) -> dict[str, object]:
    return asdict(cfg)
