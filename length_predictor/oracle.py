"""Oracle predictor: the true output length, read from the workload (experiments only).

    workload JSONL line: {"prompt_token_ids": [...], "response_len": n}    (or "prompt": text + a tokenizer)
        key = sha1(token ids as int32 bytes) ──▶ n
    predict: known prompt ─▶ LengthEstimate(n', n', n'+1, bucket(n'), 1.0)   n' = min(n, max_tokens)
             unknown prompt ─▶ the fallback (the baseline)

TetriInfer (§5.2.3, Fig. 18) compares its policies at the real predictor's accuracy
and at an ideal 100 %: this is the ideal. Prompt texts are tokenized the way the
front door does (``encode(text, add_special_tokens=True)``) so the keys match the
ids a served request carries.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput
from tetriserve.length_predictor.baseline import BucketQuantilePredictor
from tetriserve.length_predictor.buckets import BucketSpec


class OracleOptions(TypedDict, total=False):
    """``OraclePredictor``'s parameters besides the lengths (its defaults where not given)."""

    granularity: int
    fallback: LengthPredictor | None


def prompt_key(token_ids: Sequence[int]) -> str:
    return hashlib.sha1(array("i", token_ids).tobytes()).hexdigest()


class OraclePredictor:
    name = "oracle"

    def __init__(
        self, lengths: Mapping[str, int], granularity: int = 200, fallback: LengthPredictor | None = None
    ) -> None:
        if any(v < 0 for v in lengths.values()):
            raise ValueError("OraclePredictor lengths must be >= 0")
        self.lengths = dict(lengths)
        self.spec = BucketSpec(granularity)
        self.fallback: LengthPredictor = fallback if fallback is not None else BucketQuantilePredictor()
        self.hits = 0
        self.misses = 0

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[tuple[Sequence[int], int]], **kwargs: Unpack[OracleOptions]
    ) -> OraclePredictor:
        return cls({prompt_key(ids): int(n) for ids, n in pairs}, **kwargs)

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike[str],
        tokenizer_dir: str | os.PathLike[str] | None = None,
        **kwargs: Unpack[OracleOptions],
    ) -> OraclePredictor:
        """Lines with ``response_len`` and ``prompt_token_ids``, or ``prompt`` text encoded with ``tokenizer_dir``."""
        tok = None
        pairs: list[tuple[Sequence[int], int]] = []
        with Path(path).open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                ids = rec.get("prompt_token_ids")
                if ids is None:
                    if tokenizer_dir is None:
                        raise ValueError(f"{path}:{n}: no prompt_token_ids and no tokenizer to encode 'prompt'")
                    if tok is None:
                        from transformers import AutoTokenizer

                        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
                    ids = tok.encode(rec["prompt"], add_special_tokens=True)
                pairs.append((ids, int(rec["response_len"])))
        return cls.from_pairs(pairs, **kwargs)

    def warm_up(self) -> None:
        return None  # the workload is read when the predictor is built

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]:
        out: list[LengthEstimate] = []
        for item in batch:
            n = self.lengths.get(prompt_key(item.prompt_token_ids))
            if n is None:
                self.misses += 1
                out.extend(self.fallback.predict([item]))
                continue
            self.hits += 1
            n = min(n, max(item.max_tokens, 0))
            out.append(LengthEstimate(n, n, n + 1, self.spec.bucket_of(n), 1.0, self.name))
        return out

    def instant(self, item: PredictInput) -> LengthEstimate:
        return self.predict([item])[0]  # a lookup

    def observe(self, prompt_len: int, output_len: int) -> None:
        self.fallback.observe(prompt_len, output_len)
