"""AccelGen §4.4, Algorithms 1 and 2: multi-resource-aware selection (compute and KV).

    A_c = S_b (tokens of compute left), A_m = free KV (tokens, whole blocks)
    1. urgent requests (T_r ≤ T_max) go in first, in order            (Alg. 1 line 1)
    2. group = waiting requests with T_r ≤ T_r¹ + γ                   (Alg. 2 line 3)
       a long prompt in the group gets a chunk of min(A_c, what fits in A_m)   (lines 4–6)
       while some member fits (D_c ≤ A_c and D_m ≤ A_m):
           take the one with least √((A_c − D_c)² + (A_m − D_m)²)     (lines 7–12)
    3. next group, until compute or KV runs out

D_c is the tokens the request computes; D_m the KV it newly allocates
(⌈tokens/b⌉·b, counting a partly filled block it already holds). Alg. 1 lines
2–4 (preempting the batch member with the largest T_r when an urgent request
does not fit) are left to vLLM, which preempts on allocation failure in a
prefill engine anyway. ERA holds here too: one long prompt at a time.
Without remaining times (another queue policy) the whole queue is one group.
"""

from __future__ import annotations

import math

from tetriserve.prefill_worker.chunking.base import era_blocked, is_long, kv_fit, kv_tokens
from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView


def _demand(r: ReqView, a_c: int, a_m: float, block_size: int, long_prompt_tokens: int | None) -> tuple[int, int]:
    """(D_c, D_m) of ``r`` now: a long prompt is cut to what compute and KV allow."""
    d_c = r.remaining_tokens
    if is_long(r, long_prompt_tokens):
        d_c = min(d_c, a_c, kv_fit(r, a_m, block_size))
    return d_c, kv_tokens(r, d_c, block_size)


def select(state: PrefillState, budget: int, long_prompt_tokens: int | None, window_s: float) -> list[Chunk]:
    bs = state.block_size
    a_c = budget
    a_m: float = math.inf if state.free_kv_blocks is None else float(state.free_kv_blocks * bs)
    tr = state.remaining_time
    chunks: list[Chunk] = []
    long_running = era_blocked(state.ordered, long_prompt_tokens)

    def take(r: ReqView, d_c: int, d_m: int) -> None:
        nonlocal a_c, a_m, long_running
        chunks.append(Chunk(r.request_id, r.computed_tokens, d_c))
        a_c -= d_c
        a_m -= d_m
        long_running = long_running or is_long(r, long_prompt_tokens)

    def allowed(r: ReqView) -> bool:
        return r.in_progress or not (is_long(r, long_prompt_tokens) and long_running)

    rest: list[ReqView] = []
    for r in state.ordered:  # Alg. 1 line 1: urgent requests first
        if tr.get(r.request_id, math.inf) <= state.urgent_s and a_c > 0 and allowed(r):
            d_c = min(r.remaining_tokens, a_c, kv_fit(r, a_m, bs))
            if d_c > 0:
                take(r, d_c, kv_tokens(r, d_c, bs))
                continue
        rest.append(r)

    while rest and a_c > 0 and a_m > 0:
        head = tr.get(rest[0].request_id, math.inf)
        group = [r for r in rest if tr.get(r.request_id, math.inf) <= head + window_s or math.isinf(head)]
        rest = [r for r in rest if r not in group]
        while group and a_c > 0:
            best: tuple[float, ReqView, int, int] | None = None
            for r in group:
                if not allowed(r):
                    continue
                d_c, d_m = _demand(r, a_c, a_m, bs, long_prompt_tokens)
                if d_c <= 0 or d_c > a_c or d_m > a_m:
                    continue
                dist = math.hypot(a_c - d_c, 0.0 if math.isinf(a_m) else a_m - d_m)
                if best is None or dist < best[0]:
                    best = (dist, r, d_c, d_m)
            if best is None:
                break
            _, r, d_c, d_m = best
            take(r, d_c, d_m)
            group.remove(r)
    return chunks
