"""AccelGen §4.4, Algorithms 1 and 2: multi-resource-aware selection (compute and KV), with Alg. 1's preemption.

    A_c = S_b (tokens of compute left), A_m = free KV (tokens, whole blocks)
    1. urgent requests (T_r ≤ T_max) go in first, in order            (Alg. 1 line 1)
       while an urgent request's KV does not fit A_m, preempt the batch member
       with the largest T_r (above the urgent one's), which frees its KV     (Alg. 1 lines 2–4)
    2. group = waiting requests with T_r ≤ T_r¹ + γ                   (Alg. 2 line 3)
       a long prompt in the group gets a chunk of min(A_c, what fits in A_m)   (lines 4–6),
       and so does a prompt longer than S_b itself

       while some member fits (D_c ≤ A_c and D_m ≤ A_m):
           take the one with least √((A_c − D_c)² + (A_m − D_m)²)     (lines 7–12)
    3. next group, until compute or KV runs out

D_c is the tokens the request computes; D_m the KV it newly allocates
(⌈tokens/b⌉·b, counting a partly filled block it already holds). The batch
members that may be preempted are the ones that hold KV: the prompts part-way
through their chunks and, on a colocated engine, the requests already decoding
(``PrefillState.batch``). A preempted request gives up all its KV and computes
again from its first token (vLLM's recompute). Compute is Alg. 1's other
resource: urgent requests take A_c in ascending T_r, so when they overflow it
the one left out is the one with the largest T_r, as line 3 asks. ERA holds
here too: one long prompt at a time. Without remaining times (another queue
policy) the whole queue is one group, nothing is urgent and nothing is preempted.

Alg. 2 cuts only long prompts (ERA's, above 4K tokens), since on the paper's GPUs an SLO-sized budget S_b holds
any shorter one. A small engine's S_b can be shorter than an ordinary prompt (384 tokens on the CPU profile the
SLO benchmark runs with), and such a prompt would never fit D_c ≤ A_c: it is cut like a long prompt, chunk by
chunk, without counting as long for ERA.

    free KV 2 blocks of 32; urgent u (T_r 0.1) needs 96 tokens → 3 blocks
    batch: p (in progress, 64 computed → 2 blocks, T_r 4.0), q (in progress, 32 → 1 block, T_r 9.0)
    → preempt q (largest T_r): A_m = 64 + 32 = 96 ≥ 96, u takes 96 tokens; p keeps its KV
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tetriserve.prefill_worker.chunking.base import era_blocked, is_long, kv_fit, kv_tokens
from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView


@dataclass(frozen=True)
class Selected:
    """Alg. 1's batch: the chunks in selection order, and the requests preempted to make room (first first)."""

    chunks: tuple[Chunk, ...]
    preempted: tuple[str, ...] = ()


def _demand(
    r: ReqView, a_c: int, a_m: float, block_size: int, long_prompt_tokens: int | None, budget: int
) -> tuple[int, int]:
    """(D_c, D_m) of ``r`` now: a long prompt, or one larger than the whole budget S_b, is cut to what compute
    and KV allow."""
    d_c = r.remaining_tokens
    if is_long(r, long_prompt_tokens) or d_c > budget:
        d_c = min(d_c, a_c, kv_fit(r, a_m, block_size))
    return d_c, kv_tokens(r, d_c, block_size)


def select(state: PrefillState, budget: int, long_prompt_tokens: int | None, window_s: float) -> Selected:
    bs = state.block_size
    a_c = budget
    a_m: float = math.inf if state.free_kv_blocks is None else float(state.free_kv_blocks * bs)
    tr = state.remaining_time
    chunks: list[Chunk] = []
    preempted: list[str] = []
    long_running = era_blocked(state.ordered, long_prompt_tokens)
    # the batch members holding KV, which Alg. 1 may preempt: prompts part-way through, and the decoding ones
    holders = [r for r in (*state.ordered, *state.batch) if r.computed_tokens > 0]

    def t_r(r: ReqView) -> float:
        return tr.get(r.request_id, math.inf)

    def take(r: ReqView, d_c: int, d_m: int) -> None:
        nonlocal a_c, a_m, long_running
        chunks.append(Chunk(r.request_id, r.computed_tokens, d_c))
        a_c -= d_c
        a_m -= d_m
        long_running = long_running or is_long(r, long_prompt_tokens)

    def allowed(r: ReqView) -> bool:
        return r.in_progress or not (is_long(r, long_prompt_tokens) and long_running)

    def preempt_for(r: ReqView, need: int) -> None:
        """Alg. 1 lines 2–4: free KV for ``r`` from the members with the largest T_r above its own."""
        nonlocal a_m, long_running
        taken = {c.request_id for c in chunks}
        while need > a_m:
            cands = [
                h
                for h in holders
                if h.request_id not in taken and h.request_id not in preempted and h.request_id != r.request_id
                and t_r(h) > t_r(r)
            ]  # fmt: skip
            if not cands:
                return
            victim = max(cands, key=lambda h: (t_r(h), h.arrival_time, h.request_id))
            preempted.append(victim.request_id)
            a_m += victim.kv_held(bs)
            left = [h for h in state.ordered if h.request_id not in preempted]
            long_running = era_blocked(left, long_prompt_tokens) or any(
                is_long(v, long_prompt_tokens) for v in state.ordered if v.request_id in taken
            )

    rest: list[ReqView] = []
    for r in state.ordered:  # Alg. 1 line 1: urgent requests first
        if r.request_id not in preempted and t_r(r) <= state.urgent_s and a_c > 0 and allowed(r):
            want = min(r.remaining_tokens, a_c)
            if not math.isinf(a_m) and kv_tokens(r, want, bs) > a_m:
                preempt_for(r, kv_tokens(r, want, bs))
            d_c = min(want, kv_fit(r, a_m, bs))
            if d_c > 0:
                take(r, d_c, kv_tokens(r, d_c, bs))
                continue
        rest.append(r)
    rest = [r for r in rest if r.request_id not in preempted]

    while rest and a_c > 0 and a_m > 0:
        head = t_r(rest[0])
        group = [r for r in rest if t_r(r) <= head + window_s or math.isinf(head)]
        rest = [r for r in rest if r not in group]
        while group and a_c > 0:
            best: tuple[float, ReqView, int, int] | None = None
            for r in group:
                if not allowed(r):
                    continue
                d_c, d_m = _demand(r, a_c, a_m, bs, long_prompt_tokens, budget)
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
    return Selected(tuple(chunks), tuple(preempted))
