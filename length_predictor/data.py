"""(prompt, response length) pairs for the length predictor (TetriInfer §3.3.2, Fig. 8).

    salvaged ShareGPT record ─▶ every human turn answered by a gpt turn:
        prompt       = the conversation so far (turn texts joined by blank lines, the human turn last),
                       its tail kept (``max_prompt_chars``); the encoder cuts it from the left to its
                       max length (256 MiniLM tokens)
        prompt_len   = the conversation so far in TARGET-tokenizer tokens (what the prefill worker sees)
        response_len = the gpt turn in TARGET-tokenizer tokens           ← the label
        split        = hash(conversation group) → train 80 % | val 10 % | test 10 %

* **Split by conversation, deterministically**: ``split_of`` hashes the conversation's
  *group* with SHA-1 (never Python's salted ``hash``). ShareGPT cuts long conversations
  into parts ``<id>_0, <id>_1, ...``; the group strips that suffix so the parts of one
  conversation land in one split — no conversation is in two splits.
* **Labels**: by default the ShareGPT gpt turn counted in the target tokenizer (the
  tiny model's by default). That is ChatGPT's answer length, not what the served model
  would generate; ``labeling.py`` relabels the same prompts with a running cluster's
  real outputs (TetriInfer's workflow for a real target model) and writes this format.
* Files are JSON Lines, one ``Pair`` per line; ``source`` says where the label came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

from tetriserve.common.sharegpt import iter_conversations

logger = logging.getLogger(__name__)

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
SPLIT_SALT = "tetriserve-length-v1"
DEFAULT_MAX_PROMPT_CHARS = 4096
TokenCounter = Callable[[Sequence[str]], list[int]]
_PART_SUFFIX = re.compile(r"_\d+$")


class _Progress(Protocol):
    """A progress bar (``tqdm``): what ``_counted`` advances."""

    def update(self, n: int) -> object: ...


@dataclass(frozen=True)
class Pair:
    """One training example: the prompt text (tail), its target-token length, the response length."""

    conv: str
    turn: int
    split: Split
    prompt: str
    prompt_len: int
    response_len: int
    source: str = "sharegpt"

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"Pair.split must be one of {SPLITS}, got {self.split!r}")
        if self.prompt_len < 0 or self.response_len < 0:
            raise ValueError(
                f"Pair.prompt_len and Pair.response_len must be >= 0, got {self.prompt_len}, {self.response_len}"
            )


def conversation_group(conv_id: str) -> str:
    """The id without ShareGPT's ``_<part>`` suffix: all parts of one conversation share it."""
    return _PART_SUFFIX.sub("", conv_id)


def split_of(conv_id: str, salt: str = SPLIT_SALT) -> Split:
    """Deterministic 80/10/10 split of a conversation by the SHA-1 of its group."""
    digest = hashlib.sha1(f"{salt}:{conversation_group(conv_id)}".encode()).digest()
    bucket = int.from_bytes(digest[:4], "big") % 100
    return "train" if bucket < 80 else ("val" if bucket < 90 else "test")


def tokenizer_counter(tokenizer_dir: str | os.PathLike[str]) -> TokenCounter:
    """Token counts (no special tokens) of a batch of texts in the target model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = tok(list(texts), add_special_tokens=False, return_attention_mask=False)
        return [len(ids) for ids in enc["input_ids"]]

    return count


def pairs_from_record(
    record: Mapping[str, object], count: TokenCounter, max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
) -> list[Pair]:
    """Every human→gpt turn of one record as a ``Pair`` (empty list for unusable records)."""
    conv_id, turns = record.get("id"), record.get("conversations")
    if not isinstance(conv_id, str) or not isinstance(turns, list):
        return []
    texts = [_text_of(t) for t in turns]
    roles: list[object] = [t.get("from") if isinstance(t, dict) else None for t in turns]
    wanted = [i for i in range(1, len(turns)) if roles[i] == "gpt" and roles[i - 1] == "human" and texts[i - 1].strip()]
    if not wanted:
        return []
    lengths = count(texts[: wanted[-1] + 1])
    split = split_of(conv_id)
    out: list[Pair] = []
    for i in wanted:
        prompt = "\n\n".join(t for t in texts[:i] if t)
        out.append(
            Pair(
                conv=conv_id,
                turn=i,
                split=split,
                prompt=prompt[-max_prompt_chars:],
                prompt_len=sum(lengths[:i]),
                response_len=lengths[i],
            )
        )
    return out


def _text_of(turn: object) -> str:
    """A turn's text ("" for a turn without one)."""
    value = turn.get("value") if isinstance(turn, dict) else None
    return value if isinstance(value, str) else ""


def iter_pairs(
    count: TokenCounter,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
) -> Iterator[Pair]:
    """Pairs in file order from the salvaged ShareGPT records (at most ``limit``)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    produced = 0
    for record in iter_conversations(path):
        for pair in pairs_from_record(record, count, max_prompt_chars):
            if limit is not None and produced >= limit:
                return
            produced += 1
            yield pair


def build_pairs(
    out: str | os.PathLike[str],
    count: TokenCounter,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    progress: bool = True,
) -> Path:
    """Write the pairs to ``out`` (JSON Lines, atomically) and return the path."""
    from tqdm import tqdm

    with tqdm(total=limit, desc="pairs", unit="pair", disable=not progress) as bar:
        written = write_pairs(out, _counted(iter_pairs(count, path, limit, max_prompt_chars), bar))
    logger.info("wrote %s pairs to %s", written, out)
    return Path(out)


def _counted(pairs: Iterable[Pair], bar: _Progress) -> Iterator[Pair]:
    for pair in pairs:
        bar.update(1)
        yield pair


def write_pairs(out: str | os.PathLike[str], pairs: Iterable[Pair]) -> int:
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for pair in pairs:
            fh.write(json.dumps(asdict(pair), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, dst)
    return n


def read_pairs(path: str | os.PathLike[str]) -> list[Pair]:
    out: list[Pair] = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(Pair(**json.loads(line)))
    return out


def by_split(pairs: Iterable[Pair]) -> dict[Split, list[Pair]]:
    out: dict[Split, list[Pair]] = {s: [] for s in SPLITS}
    for p in pairs:
        out[p.split].append(p)
    return out


def label_stats(pairs: Sequence[Pair]) -> dict[str, float]:
    """Summary of the labels (response lengths): count, mean, median, p90, p99, max."""
    if not pairs:
        return {"count": 0}
    values = sorted(p.response_len for p in pairs)

    def q(f: float) -> float:
        return float(values[min(len(values) - 1, round(f * (len(values) - 1)))])

    return {
        "count": len(values),
        "mean": round(sum(values) / len(values), 2),
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": float(values[-1]),
    }
