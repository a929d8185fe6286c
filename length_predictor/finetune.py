"""Full fine-tuning (GPU): encoder and heads learn together, as TetriInfer fine-tunes OPT-125M.

    prompt text ─tokenize (left cut)─▶ MiniLM (trainable) ─mean pool─▶ ⊕ log1p(prompt_len) ─▶ LengthHeads
    stage 1 (Trainer, bf16 on GPU): bucket CE + length MSE through encoder and heads
    then: embed train/val with the tuned encoder ─▶ stage 2 + widths on features (train.finish_heads)
    save: tuned encoder ─▶ <out>/encoder/ (save_pretrained; ~90 MB, never committed)
          heads + meta ─▶ <out>/heads-g<g>.json with encoder.dir = <out>/encoder

On CPU this path runs but is only smoke-tested on a handful of examples
(``tests/unit/test_length_predictor_train.py``); fast mode (train.py) is the CPU path.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch
from torch import nn

from tetriserve.length_predictor.encoder import FEATURE_DIM, Encoder, features, length_feature, mean_pool
from tetriserve.length_predictor.heads import LengthHeads
from tetriserve.length_predictor.train import TrainConfig, TrainedHeads, finish_heads, new_heads, training_args

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class TextRow(TypedDict):
    """One training example as ``TextCollator`` takes it."""

    text: str
    length_feature: float
    bucket_labels: int
    length_labels: float
    direction_labels: int


class FullModel(nn.Module):
    """Encoder + heads in one module, so ``Trainer`` back-propagates through both."""

    def __init__(self, encoder: PreTrainedModel, heads: LengthHeads) -> None:
        super().__init__()
        self.encoder = encoder
        self.heads = heads

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length_feature: torch.Tensor,
        **labels: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = mean_pool(hidden, attention_mask).float()
        feature = torch.cat([pooled, length_feature.unsqueeze(-1).float()], dim=-1)
        out: dict[str, torch.Tensor] = self.heads(feature, **labels)
        return out


class TextDataset(torch.utils.data.Dataset[TextRow]):
    def __init__(
        self,
        prompts: Sequence[str],
        prompt_lens: Sequence[int],
        lengths: np.ndarray,
        granularity_of: Callable[[int], int],
    ) -> None:
        self.prompts = list(prompts)
        self.feat = length_feature(np.asarray(prompt_lens))
        self.lengths = np.asarray(lengths, dtype=np.float32)
        self.buckets = [granularity_of(int(v)) for v in lengths]

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> TextRow:
        return {
            "text": self.prompts[i],
            "length_feature": float(self.feat[i]),
            "bucket_labels": self.buckets[i],
            "length_labels": float(self.lengths[i]),
            "direction_labels": 0,
        }


class TextCollator:
    """Tokenizes a batch (cut from the left) and stacks the labels."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, rows: list[TextRow]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            [r["text"] for r in rows], truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "length_feature": torch.tensor([r["length_feature"] for r in rows], dtype=torch.float32),
            "bucket_labels": torch.tensor([r["bucket_labels"] for r in rows], dtype=torch.long),
            "length_labels": torch.tensor([r["length_labels"] for r in rows], dtype=torch.float32),
            "direction_labels": torch.tensor([r["direction_labels"] for r in rows], dtype=torch.long),
        }


def finetune_full(
    train: tuple[Sequence[str], Sequence[int], np.ndarray],
    val: tuple[Sequence[str], Sequence[int], np.ndarray],
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    max_length: int = 256,
    encoder_lr: float = 3e-5,
    max_steps: int = -1,
) -> tuple[TrainedHeads, Path]:
    """Fine-tune encoder + heads on (prompts, prompt_lens, response lengths); returns heads and encoder dir."""
    from transformers import Trainer

    encoder = Encoder.load(max_length=max_length, dtype="float32")
    heads, spec = new_heads(FEATURE_DIM, cfg, np.asarray(train[2]))
    model = FullModel(encoder.model, heads)
    heads.set_stage(1)
    for p in model.encoder.parameters():
        p.requires_grad = True
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="tetriserve-finetune-") as tmp:
        args = training_args(
            tmp,
            cfg,
            cfg.epochs,
            learning_rate=encoder_lr,
            per_device_train_batch_size=min(cfg.batch_size, 64),
            per_device_eval_batch_size=64,
            bf16=gpu,
            max_steps=max_steps,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=TextDataset(*train, spec.bucket_of),
            eval_dataset=TextDataset(*val, spec.bucket_of),
            data_collator=TextCollator(encoder.tokenizer, max_length),
        )
        trainer.train()
    model.eval()
    tuned = Encoder(encoder.tokenizer, model.encoder, max_length)
    train_x = features(tuned.embed(list(train[0]), progress=cfg.progress), train[1])
    val_x = features(tuned.embed(list(val[0]), progress=cfg.progress), val[1])
    result = finish_heads(heads, spec, train_x, np.asarray(train[2]), val_x, np.asarray(val[2]), cfg)
    enc_dir = Path(out_dir) / "encoder"
    model.encoder.save_pretrained(str(enc_dir))
    encoder.tokenizer.save_pretrained(str(enc_dir))
    logger.info("fine-tuned encoder saved to %s", enc_dir)
    return result, enc_dir
