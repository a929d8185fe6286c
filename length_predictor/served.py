"""The trained predictor as served inside each prefill worker (TetriInfer §3.3.2 parallel mode).

    predict([PredictInput(prompt_len, max_tokens, prompt_token_ids)])        (called via asyncio.to_thread)
      └─ CoalescingBatcher: concurrent calls become one batch
           ├─ text = target tokenizer.decode(last ``decode_tail`` ids)     (empty ids → "")
           ├─ MiniLM lengths (cut from the left at max_length) ─▶ plan_batches:
           │     prompts over ``pad_cutoff`` tokens run alone, the rest in length-sorted batches
           │     of at most ``max_batch`` (TetriInfer's padding cut-off, §5.2.2)
           ├─ embeddings ⊕ log1p(prompt_len) ─▶ heads ─▶ bucket k, length X̂, direction
           └─ c = alpha/(1+beta*lambda) (ArrivalRateMeter) ─▶ padded estimate ─▶ LengthEstimate

* Picklable for Ray: only paths and parameters travel; the encoder, heads and
  target tokenizer load on the first ``predict`` (``__getstate__`` drops them).
* Never fails a request: if loading or inference raises, the error is logged once
  and the fallback (the baseline) answers; ``observe`` keeps that fallback warm.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput
from tetriserve.length_predictor.baseline import BucketQuantilePredictor
from tetriserve.length_predictor.batcher import CoalescingBatcher
from tetriserve.length_predictor.padding import ArrivalRateMeter, PaddingParams, padded_estimate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tetriserve.length_predictor.artifact import Artifact
    from tetriserve.length_predictor.encoder import Encoder

logger = logging.getLogger(__name__)


class LoadedModels(TypedDict):
    """What the first ``predict`` loads: the heads' artifact, the encoder, the target tokenizer (None: none)."""

    art: Artifact
    encoder: Encoder
    tokenizer: PreTrainedTokenizerBase | None


def plan_batches(token_lengths: Sequence[int], pad_cutoff: int, max_batch: int) -> list[list[int]]:
    """Index groups: each prompt longer than ``pad_cutoff`` alone, the rest by length, ``max_batch`` at most."""
    if pad_cutoff < 1 or max_batch < 1:
        raise ValueError(f"pad_cutoff and max_batch must be >= 1, got {pad_cutoff}, {max_batch}")
    long = [[i] for i, n in enumerate(token_lengths) if n > pad_cutoff]
    short = sorted((i for i, n in enumerate(token_lengths) if n <= pad_cutoff), key=lambda i: token_lengths[i])
    return [short[s : s + max_batch] for s in range(0, len(short), max_batch)] + long


class TrainedPredictor:
    """``LengthPredictor`` backed by the committed heads and the packaged MiniLM encoder."""

    def __init__(
        self,
        artifact_path: str | os.PathLike[str],
        target_tokenizer: str | os.PathLike[str] | None = None,
        *,
        padding: PaddingParams | None = None,
        max_batch: int = 32,
        pad_cutoff: int = 128,
        decode_tail: int = 1024,
        fallback: LengthPredictor | None = None,
        encoder_dtype: str = "auto",
    ) -> None:
        path = Path(artifact_path)
        if not path.is_file():
            raise FileNotFoundError(f"predictor artifact {path} not found; run `tetriserve predictor train`")
        meta = json.loads(path.read_text(encoding="utf-8"))
        self.artifact_path = str(path)
        self.name = f"trained-g{meta['buckets']['granularity']}"
        self.target_tokenizer = str(target_tokenizer) if target_tokenizer else None
        self.padding_override = padding
        self.max_batch = max_batch
        self.pad_cutoff = pad_cutoff
        self.decode_tail = decode_tail
        self.encoder_dtype = encoder_dtype
        self.fallback: LengthPredictor = fallback if fallback is not None else BucketQuantilePredictor()
        plan_batches([], pad_cutoff, max_batch)  # validates both
        self._init_runtime()

    # -- pickling: parameters travel, loaded models do not ---------------------------------
    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._loaded: LoadedModels | None = None
        self._load_error: BaseException | None = None
        self._batcher: CoalescingBatcher[PredictInput, LengthEstimate] = CoalescingBatcher(
            self._predict_now, max_items=max(self.max_batch * 4, 1)
        )
        self._meter = ArrivalRateMeter((self.padding_override or PaddingParams()).window_s)

    def __getstate__(self) -> dict[str, object]:
        keep = ("_lock", "_loaded", "_load_error", "_batcher", "_meter")
        return {k: v for k, v in self.__dict__.items() if k not in keep}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- the protocol --------------------------------------------------------------------
    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        if not batch:
            return []
        return self._batcher(list(batch))

    def instant(self, item: PredictInput) -> LengthEstimate:
        return self.fallback.instant(item)  # no encoder: the fallback, kept warm by ``observe``

    def observe(self, prompt_len: int, output_len: int) -> None:
        self.fallback.observe(prompt_len, output_len)

    def load(self) -> LoadedModels:
        """Load the encoder, heads and target tokenizer now (otherwise the first ``predict`` does)."""
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    # -- internals -------------------------------------------------------------------------
    def _load(self) -> LoadedModels:
        from tetriserve.length_predictor.artifact import load
        from tetriserve.length_predictor.encoder import Encoder

        t0 = time.perf_counter()
        art = load(self.artifact_path)
        encoder = Encoder.load(art.encoder_dir, art.max_length, dtype=self.encoder_dtype, device="cpu")
        tokenizer: PreTrainedTokenizerBase | None = None
        if self.target_tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.target_tokenizer)
        logger.info("%s loaded in %.2fs (%s)", self.name, time.perf_counter() - t0, self.artifact_path)
        return {"art": art, "encoder": encoder, "tokenizer": tokenizer}

    def warm_up(self) -> None:
        """Load the models at worker start; a failure is logged once and the fallback answers from then on."""
        if self._load_error is None and self._loaded is None:
            try:
                self.load()
            except Exception as exc:  # a missing encoder must not fail requests
                self._load_error = exc
                logger.exception("%s failed to load; the fallback %s answers", self.name, self.fallback.name)

    def _predict_now(self, items: list[PredictInput]) -> list[LengthEstimate]:
        self.warm_up()  # no-op once loaded (or once failed)
        if self._load_error is not None:
            return self.fallback.predict(items)
        try:
            return self._predict_model(items)
        except Exception:
            logger.exception("%s failed on a batch of %s; the fallback answers it", self.name, len(items))
            return self.fallback.predict(items)

    def _predict_model(self, items: list[PredictInput]) -> list[LengthEstimate]:
        import numpy as np
        import torch

        from tetriserve.length_predictor.encoder import EMBED_DIM, features
        from tetriserve.length_predictor.heads import infer

        loaded = self.load()
        art, encoder = loaded["art"], loaded["encoder"]
        now = time.monotonic()
        self._meter.record(now, len(items))
        confidence = (self.padding_override or art.padding).confidence(self._meter.rate(now))
        texts = [self._text(loaded["tokenizer"], it) for it in items]
        emb = np.zeros((len(items), EMBED_DIM), dtype=np.float32)
        for group in plan_batches(encoder.token_lengths(texts), self.pad_cutoff, self.max_batch):
            emb[group] = encoder.embed_batch([texts[i] for i in group])
        feats = torch.as_tensor(features(emb, [it.prompt_len for it in items]))
        out = infer(art.heads, feats)
        return [
            padded_estimate(
                out.length[i], out.under[i], out.bucket[i], art.spec, art.widths, confidence, it.max_tokens, self.name
            )
            for i, it in enumerate(items)
        ]

    def _text(self, tokenizer: PreTrainedTokenizerBase | None, item: PredictInput) -> str:
        ids = item.prompt_token_ids[-self.decode_tail :] if self.decode_tail else ()
        if tokenizer is None or not ids:
            return ""
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))
