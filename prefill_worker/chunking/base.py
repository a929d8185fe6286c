"""The chunking policy seam: ``token_budget(state) -> int`` and ``plan(state) -> list[Chunk]``.

``fill_in_order`` is the slice-and-merge step every policy shares (TetriInfer
§3.3.3, Fig. 7): walk the ordered queue, give each request as many of its
remaining prompt tokens as the budget has left, and cut the last one into a
chunk. With ``long_prompt_tokens`` set it also applies AccelGen's Exclusive
Request Allocation (§4.2): a new prompt longer than that may not start while
another long prompt is in progress or already in this iteration.

    budget 8, queue [A:3][B:6][C:2]  →  iteration 1: A A A B B B B B
                                        iteration 2: B C C
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import ClassVar, Protocol

from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView


class ChunkingPolicy(Protocol):
    name: ClassVar[str]

    def token_budget(self, state: PrefillState) -> int: ...

    def plan(self, state: PrefillState) -> list[Chunk]: ...


def is_long(r: ReqView, long_prompt_tokens: int | None) -> bool:
    return long_prompt_tokens is not None and r.prompt_len > long_prompt_tokens


def era_blocked(ordered: Iterable[ReqView], long_prompt_tokens: int | None) -> bool:
    """True when a long prompt is already in progress, so ERA lets no new long prompt start."""
    return any(r.in_progress and is_long(r, long_prompt_tokens) for r in ordered)


def fill_in_order(
    ordered: Iterable[ReqView], budget: int, long_prompt_tokens: int | None = None, whole_prompts: bool = False
) -> list[Chunk]:
    """Slice and merge prompts into one iteration of at most ``budget`` tokens, in the given order.

    ``whole_prompts``: never cut a prompt (unchunked prefill); stop at the first that does not fit,
    unless nothing is planned yet, in which case it gets what the budget allows.
    """
    ordered = list(ordered)
    chunks: list[Chunk] = []
    left = budget
    long_running = era_blocked(ordered, long_prompt_tokens)
    for r in ordered:
        if left <= 0:
            break
        n = min(r.remaining_tokens, left)
        if n <= 0:
            continue
        long = is_long(r, long_prompt_tokens)
        if long and not r.in_progress and long_running:
            continue  # ERA: finish the long prompt in progress first
        if whole_prompts and n < r.remaining_tokens and chunks:
            break
        chunks.append(Chunk(r.request_id, r.computed_tokens, n))
        left -= n
        long_running = long_running or long
    return chunks


def kv_tokens(r: ReqView, tokens: int, block_size: int) -> int:
    """AccelGen D_m: KV slots (whole blocks, in tokens) that ``tokens`` more prompt tokens of ``r`` allocate."""
    held = math.ceil(r.computed_tokens / block_size)
    need = math.ceil((r.computed_tokens + tokens) / block_size)
    return (need - held) * block_size


def kv_fit(r: ReqView, free_tokens: float, block_size: int) -> int:
    """The most prompt tokens of ``r`` whose new blocks fit in ``free_tokens`` of KV."""
    if math.isinf(free_tokens):
        return r.remaining_tokens
    held = math.ceil(r.computed_tokens / block_size)
    limit = (held + int(free_tokens) // block_size) * block_size - r.computed_tokens
    return max(0, min(r.remaining_tokens, limit))
