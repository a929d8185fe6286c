"""Frozen views that decode-side policies decide from (``docs/design/policy-seam.md``).

``DecodeReqView`` is one request on a decode worker: its context so far, how
much it may still generate and the predicted length range; ``DecodeState`` is
the worker's KV budget and running batch at one scheduling step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from tetriserve.common.length import LengthEstimate

LengthEnd = Literal["lower", "estimate", "upper"]


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(max(0, tokens) / block_size)


def predicted_remaining(
    estimate: LengthEstimate | None, max_tokens: int, generated: int, end: LengthEnd = "lower"
) -> int:
    """Tokens still to generate by the predicted range's ``end`` (TetriInfer uses the lower end); without an
    estimate, all of ``max_tokens``."""
    total = getattr(estimate, end) if estimate is not None else max_tokens
    return max(0, min(total, max_tokens) - generated)


@dataclass(frozen=True)
class DecodeReqView:
    request_id: str
    prompt_len: int  # tokens in its context when decoding starts (prompt + first token)
    max_tokens: int  # tokens it may still generate at most
    arrival_time: float = 0.0
    generated: int = 0  # tokens generated on this worker so far
    estimate: LengthEstimate | None = None
    held_blocks: int = 0  # KV blocks it holds now: ⌈computed tokens / b⌉ (a waiting request: its landed KV's)
    tbt_slo_s: float | None = None  # its time-between-tokens SLO, if it has one
    transferring: bool = False  # its KV is in flight (being loaded, swapped out or shipped elsewhere)
    # a waiting request: when its latest token came (when it came to this engine, or was preempted); None for a
    # running member, whose latest token came with the latest step
    waited_since: float | None = None

    @property
    def context(self) -> int:
        return self.prompt_len + self.generated

    def predicted_remaining(self, end: LengthEnd = "lower") -> int:
        return predicted_remaining(self.estimate, self.max_tokens, self.generated, end)

    def tbt_slack(self, now: float) -> float | None:
        """Its remaining time to its TBT SLO at ``now`` (CacheOpt §3.3.2's RT_tbt); None without an SLO."""
        if self.tbt_slo_s is None:
            return None
        since = self.waited_since if self.waited_since is not None else now
        return self.tbt_slo_s - (now - since)

    def blocks_at(self, steps: int, block_size: int, end: LengthEnd = "lower") -> int:
        """KV blocks it holds ``steps`` iterations from now, if it is still running then."""
        return blocks_for(self.context + min(steps, self.predicted_remaining(end)), block_size)


@dataclass(frozen=True)
class DecodeState:
    free_blocks: int
    block_size: int
    running: tuple[DecodeReqView, ...] = ()
    now: float = 0.0  # same clock as ``DecodeReqView.arrival_time``
    step_s: float = 0.0  # the engine's recent decode iteration time
    max_step_s: float = 0.0  # the longest recent decode iteration (CacheOpt §3.3.2's T_I^max)

    @property
    def capacity(self) -> int:
        """Blocks the batch may use in all: what is free plus what its members hold."""
        return self.free_blocks + sum(r.held_blocks for r in self.running)

    def fits_now(self, req: DecodeReqView) -> bool:
        """Whether ``req``'s context fits the free KV now (vLLM's own test; an empty batch's for every policy)."""
        return blocks_for(req.context, self.block_size) - req.held_blocks <= self.free_blocks

    def with_admitted(self, req: DecodeReqView) -> DecodeState:
        """The state after ``req`` joins the batch: its context's blocks move from the free pool to it."""
        need = blocks_for(req.context, self.block_size)
        taken = max(0, need - req.held_blocks)
        joined = replace(req, held_blocks=max(need, req.held_blocks))
        return replace(self, free_blocks=self.free_blocks - taken, running=(*self.running, joined))


@dataclass(frozen=True)
class DecodeSnapshot:
    """What the decode worker reads of its engine's scheduler, published by the engine thread."""

    remaining_tokens: int  # Σ predicted tokens still to generate, running and queued
    step_s: float  # smoothed decode step time (0 while nothing runs)
    running: tuple[DecodeReqView, ...]  # by the worker's ids; only while slices are on
    preemption: dict[str, str]
    decisions: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # policy -> decision -> count
    admission_cost: dict[str, str] = field(default_factory=dict)  # the engine thread's time in admission
