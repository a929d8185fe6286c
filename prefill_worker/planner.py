"""The prefill engine's per-iteration decisions, with no engine in sight: which prompts get how many tokens.

    views of the prompts still to prefill ─▶ plan(views, pool, now) ─▶ PrefillPlan(chunks, tokens, budget,
    (and of the batch's other KV holders)                                          preempt)
    the iteration's chunks and its time   ─▶ observe(chunks, exec_s, scheduled, now)
                                             (SOLA eq. 5's online correction; when each was last served)

A ``PrefillPlanner`` holds the configured ``PrefillPolicy``: the queue policy orders the prompts (FCFS, SJF,
LJF, AccelGen's and SOLA's orders; TetriInfer §3.3.1's PrefillSchedBatch), the chunking policy sets the
iteration's token budget and cuts it into chunks (TetriInfer §3.3.2's ChunkSize, AccelGen's dynamic chunks).
With AccelGen's multi-resource selection the plan also names the batch members to preempt for an urgent
request (Alg. 1 lines 2–4), which the adapter preempts before vLLM schedules. It also remembers when each
prompt last got a chunk, the ``queued_since`` the orders age by. It takes the time
as an argument and reads no clock; ``prefill_worker/vllm_scheduler.py`` turns vLLM's queues into views and the
plan back into vLLM's queues and token budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tetriserve.common.sola_state import Observed
from tetriserve.prefill_worker.policy import PrefillPolicy, PrefillPolicySpec, build_prefill_policy
from tetriserve.prefill_worker.views import Chunk, PrefillState, ReqView


@dataclass(frozen=True)
class KVPool:
    """What the plan may take of the engine: tokens an iteration may hold, the KV block size, free blocks."""

    max_tokens: int
    block_size: int
    free_blocks: int
    total_blocks: int | None = None  # the engine's KV blocks in all (SOLA's m_ratio)


@dataclass(frozen=True)
class PrefillPlan:
    chunks: tuple[Chunk, ...]  # in plan order: each prompt's tokens this iteration
    tokens: int  # Σ chunk tokens
    budget: int  # the chunking policy's token budget (the plan may use less)
    preempt: tuple[str, ...] = ()  # requests to preempt (give up their KV) before the iteration, first first


@dataclass
class PrefillPlanner:
    policy: PrefillPolicy
    _queued_since: dict[str, float] = field(default_factory=dict)  # request id -> when it last got a chunk

    @classmethod
    def fixed(cls, chunk_size: int) -> PrefillPlanner:
        """FCFS with fixed chunks of ``chunk_size``: the role's policy until one is configured."""
        return cls(build_prefill_policy(PrefillPolicySpec(chunk_size=chunk_size), None))

    def queued_since(self, request_id: str, arrival: float) -> float:
        """When the request last got a chunk; its arrival while it has had none."""
        return self._queued_since.get(request_id, arrival)

    @property
    def preempts(self) -> bool:
        """Whether the chunking policy may preempt batch members (AccelGen Alg. 1): then ``plan`` wants the
        views of the batch's other KV holders too."""
        return bool(getattr(self.policy.chunking, "preempts", False))

    def plan(
        self,
        views: Sequence[ReqView],
        pool: KVPool,
        now: float,
        batch: Sequence[ReqView] = (),
        decoding: Sequence[Observed] = (),
    ) -> PrefillPlan:
        """This iteration's chunks: the queue policy's order, then the chunking policy's cut of its budget.
        ``batch``: the engine's other requests holding KV (decoding on a colocated engine), which a policy
        that preempts may choose among; ``decoding``: the same requests as SOLA's state monitor reads them."""
        policy = self.policy
        ordered = tuple(policy.queue.order(list(views), now))
        state = PrefillState(
            ordered=ordered,
            max_budget=pool.max_tokens,
            block_size=pool.block_size,
            free_kv_blocks=pool.free_blocks,
            remaining_time=policy.queue.remaining_times((*ordered, *batch), now),
            urgent_s=policy.cost.iteration_seconds() if policy.cost is not None else 0.0,
            batch=tuple(batch),
            now=now,
            decoding=tuple(decoding),
            total_kv_blocks=pool.total_blocks,
        )
        chunks = tuple(policy.chunking.plan(state))
        planned = {c.request_id for c in chunks}
        policy.queue.on_scheduled([v for v in ordered if v.request_id in planned], now)
        preempted = getattr(policy.chunking, "preempted", None)
        preempt = tuple(preempted(state)) if callable(preempted) else ()
        return PrefillPlan(chunks, sum(c.tokens for c in chunks), policy.chunking.token_budget(state), preempt)

    def predicted_s(self, chunks: Sequence[tuple[int, int]]) -> float | None:
        """The cost model's time for an iteration of ``(computed, tokens)`` chunks; None without a cost model."""
        cost = self.policy.cost
        return cost.prefill_time(list(chunks)) if cost is not None else None

    def observe(self, chunks: Sequence[tuple[int, int]], exec_s: float, scheduled: Iterable[str], now: float) -> None:
        """An iteration of ``chunks`` took ``exec_s``: the cost model corrects itself (SOLA eq. 5), and each
        scheduled request was last served ``now``."""
        if self.policy.cost is not None:
            self.policy.cost.observe_prefill(list(chunks), exec_s)
        for rid in scheduled:
            self._queued_since[rid] = now

    def forget(self, live: set[str]) -> None:
        """Drop what is kept of requests no longer in ``live`` (finished or aborted)."""
        for rid in [r for r in self._queued_since if r not in live]:
            del self._queued_since[rid]
            self.policy.queue.forget(rid)

    @property
    def remembered(self) -> int:
        return len(self._queued_since)
