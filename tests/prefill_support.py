"""Small factories and a tiny iteration simulator for prefill-policy tests (no Ray, no vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.prefill_worker.chunking import ChunkingPolicy
from tetriserve.prefill_worker.queue import QueuePolicy
from tetriserve.prefill_worker.views import PrefillState, ReqView


def req(rid: str, prompt_len: int, arrival: float = 0.0, **kw: object) -> ReqView:
    return ReqView(rid, prompt_len, 16, arrival, **kw)  # type: ignore[arg-type]


def linear_cost(per_token_s: float = 1e-3, pivot_tokens: int = 512, pivot_s: float = 0.5) -> CostEstimator:
    """C^p = per_token · Σ l_in: a 512-token iteration takes 0.5 s by default."""
    return CostEstimator(PrefillCost(0.0, 0.0, per_token_s, 0.0), DecodeCost(0.0, 0.0, 0.0), pivot_tokens, pivot_s)


def state(ordered: Sequence[ReqView], max_budget: int = 1 << 20, **kw: object) -> PrefillState:
    return PrefillState(ordered=tuple(ordered), max_budget=max_budget, **kw)  # type: ignore[arg-type]


def layouts(
    queue: QueuePolicy, chunking: ChunkingPolicy, reqs: Sequence[ReqView], max_iters: int = 100
) -> list[list[tuple[str, int]]]:
    """Run iterations until every prompt is prefilled; each iteration as [(request, tokens), ...]."""
    live = {r.request_id: r for r in reqs}
    out: list[list[tuple[str, int]]] = []
    for _ in range(max_iters):
        pending = [r for r in live.values() if r.remaining_tokens > 0]
        if not pending:
            return out
        chunks = chunking.plan(state(queue.order(pending, 0.0)))
        assert chunks, "a plan with work pending must not be empty"
        out.append([(c.request_id, c.tokens) for c in chunks])
        for c in chunks:
            r = live[c.request_id]
            assert c.start == r.computed_tokens
            live[c.request_id] = replace(r, computed_tokens=r.computed_tokens + c.tokens)
    raise AssertionError("did not finish")
