"""Relabel prompts with the target model's real output lengths, through a running cluster (TetriInfer Fig. 8).

    pairs (data.py) ─prompt─▶ TetriServeClient.complete(prompt, max_tokens, temperature) ─▶ gRPC front door
                                                      ─▶ tetriserve cluster (the target model) ─▶ usage
    same pair, response_len = usage.completion_tokens, source = "cluster:<model>" ─▶ JSONL (data.py format)

* Runs ``concurrency`` requests at a time from a thread pool; order is kept.
* A prompt the server rejects (too long for the model's context, say) is dropped
  and counted, not fatal; any other error stops the run.
* Train on the result with ``tetriserve predictor train --pairs FILE``: the prompts
  are unchanged, so the cached embeddings are reused.
* An output that stops at ``max_tokens`` is censored; set ``max_tokens`` at the
  model's context (TetriInfer labels what the target *would* generate).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from tetriserve.length_predictor.data import Pair, write_pairs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelOptions:
    """How prompts are sent to the cluster."""

    target: str = "localhost:50051"
    max_tokens: int = 1024
    temperature: float = 0.0
    concurrency: int = 8
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"LabelOptions.max_tokens must be >= 1, got {self.max_tokens}")
        if self.concurrency < 1:
            raise ValueError(f"LabelOptions.concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class LabelStats:
    labelled: int
    rejected: int
    hit_max_tokens: int


def label_with_cluster(
    pairs: Sequence[Pair], out: str | os.PathLike[str], opts: LabelOptions, progress: bool = True
) -> LabelStats:
    """Send every prompt through the cluster; write the relabelled pairs to ``out``."""
    from tqdm import tqdm

    from tetriserve.client import InvalidArgument, TetriServeClient

    rejected = 0
    capped = 0
    with TetriServeClient(opts.target, timeout=opts.timeout_s) as client:
        model = client.health(timeout=opts.timeout_s).model

        def one(pair: Pair) -> Pair | None:
            try:
                c = client.complete(pair.prompt or " ", max_tokens=opts.max_tokens, temperature=opts.temperature)
            except InvalidArgument as exc:
                logger.debug("conversation %s turn %s rejected: %s", pair.conv, pair.turn, exc)
                return None
            n = c.usage.completion_tokens if c.usage is not None else len(c.token_ids)
            return replace(pair, response_len=n, source=f"cluster:{model}")

        def results() -> Iterator[Pair]:
            nonlocal rejected, capped
            with ThreadPoolExecutor(opts.concurrency, thread_name_prefix="label") as pool:
                for labelled in tqdm(pool.map(one, pairs), total=len(pairs), desc="label", disable=not progress):
                    if labelled is None:
                        rejected += 1
                        continue
                    capped += labelled.response_len >= opts.max_tokens
                    yield labelled

        written = write_pairs(Path(out), results())
    stats = LabelStats(written, rejected, capped)
    logger.info(
        "labelled %s pairs via %s (%s rejected, %s hit max_tokens) -> %s", written, opts.target, rejected, capped, out
    )
    return stats
