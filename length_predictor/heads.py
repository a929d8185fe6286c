"""The trainable heads on top of the encoder's features (TetriInfer §3.3.2 + CacheOpt §3.2, Fig. 10).

    feature [385] ─LayerNorm─▶ trunk: Linear(385→H) GELU Dropout ─▶ h [H]
        h ──Linear(H→K)──────────────────────────────▶ bucket logits        (a) TetriInfer's classifier
        h ──Linear(H→R) GELU──▶ r ──Linear(R→1)──────▶ log1p(length)        (b) CacheOpt's length regressor
        [h | r] ──Linear(H+R→2)──────────────────────▶ deviation direction  (b) CacheOpt's binary classifier
                                                         0 = over-predicted (actual < predicted)
                                                         1 = under-predicted (actual > predicted)

Two stages, as in CacheOpt ("first without the binary classifier, then ... including it"):

1. ``stage = 1``: loss = CE(bucket) + ``reg_weight`` · MSE(log1p length) trains trunk, bucket and regressor.
2. ``stage = 2``: direction labels come from stage 1's own predictions on the training set; loss =
   CE(direction). Only the direction layer learns (the rest is frozen), so the regressor whose
   errors it learned to anticipate does not move under it.

``forward`` returns a dict with ``loss`` when labels are given, as Hugging Face ``Trainer`` expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import torch
from torch import nn
from torch.nn import functional as F

LABEL_NAMES = ["bucket_labels", "length_labels", "direction_labels"]


class HeadsConfigDict(TypedDict):
    """``HeadsConfig`` as the artifact's JSON holds it."""

    in_dim: int
    num_buckets: int
    hidden: int
    reg_hidden: int
    dropout: float
    reg_weight: float


@dataclass(frozen=True)
class HeadsConfig:
    """Shapes of the heads; stored in the artifact's JSON."""

    in_dim: int
    num_buckets: int
    hidden: int = 256
    reg_hidden: int = 64
    dropout: float = 0.1
    reg_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("in_dim", "num_buckets", "hidden", "reg_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"HeadsConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"HeadsConfig.dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> HeadsConfigDict:
        return HeadsConfigDict(
            in_dim=self.in_dim,
            num_buckets=self.num_buckets,
            hidden=self.hidden,
            reg_hidden=self.reg_hidden,
            dropout=self.dropout,
            reg_weight=self.reg_weight,
        )


class LengthHeads(nn.Module):
    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.heads_config = config  # not `config`: Trainer treats a `config` attribute as a PretrainedConfig
        self.stage = 1
        self.norm = nn.LayerNorm(config.in_dim)
        self.trunk = nn.Sequential(nn.Linear(config.in_dim, config.hidden), nn.GELU(), nn.Dropout(config.dropout))
        self.bucket = nn.Linear(config.hidden, config.num_buckets)
        self.reg_hidden = nn.Sequential(nn.Linear(config.hidden, config.reg_hidden), nn.GELU())
        self.reg_out = nn.Linear(config.reg_hidden, 1)
        self.direction = nn.Linear(config.hidden + config.reg_hidden, 2)

    def set_stage(self, stage: int) -> None:
        """Stage 1 trains everything but the direction layer; stage 2 only the direction layer."""
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage}")
        self.stage = stage
        for name, param in self.named_parameters():
            param.requires_grad = name.startswith("direction.") == (stage == 2)

    def forward(
        self,
        features: torch.Tensor,
        bucket_labels: torch.Tensor | None = None,
        length_labels: torch.Tensor | None = None,
        direction_labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        h = self.trunk(self.norm(features))
        r = self.reg_hidden(h)
        out = {
            "bucket_logits": self.bucket(h),
            "log_length": self.reg_out(r).squeeze(-1),
            "direction_logits": self.direction(torch.cat([h, r], dim=-1)),
        }
        loss = self._loss(out, bucket_labels, length_labels, direction_labels)
        return out if loss is None else {"loss": loss, **out}

    def _loss(
        self,
        out: dict[str, torch.Tensor],
        bucket_labels: torch.Tensor | None,
        length_labels: torch.Tensor | None,
        direction_labels: torch.Tensor | None,
    ) -> torch.Tensor | None:
        if self.stage == 2:
            if direction_labels is None:
                return None
            return F.cross_entropy(out["direction_logits"], direction_labels)
        if bucket_labels is None or length_labels is None:
            return None
        ce = F.cross_entropy(out["bucket_logits"], bucket_labels)
        mse = F.mse_loss(out["log_length"], torch.log1p(length_labels.float()))
        return ce + self.heads_config.reg_weight * mse


@dataclass(frozen=True)
class HeadOutputs:
    """Numpy-free per-item outputs of one inference pass."""

    bucket: list[int]
    bucket_prob: list[float]
    length: list[float]
    under: list[bool]


def infer(heads: LengthHeads, feats: torch.Tensor) -> HeadOutputs:
    """Bucket argmax (and its probability), regressed length, and predicted direction."""
    with torch.inference_mode():
        out = heads(feats)
    probs = out["bucket_logits"].softmax(-1)
    top = probs.max(-1)
    return HeadOutputs(
        bucket=top.indices.tolist(),
        bucket_prob=top.values.tolist(),
        length=torch.expm1(out["log_length"]).clamp(min=0).tolist(),
        under=(out["direction_logits"].argmax(-1) == 1).tolist(),
    )
