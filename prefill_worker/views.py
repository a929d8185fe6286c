"""Frozen views that prefill-side policies decide from (``docs/design/policy-seam.md``).

``ReqView`` is one request as a policy sees it; ``PrefillState`` is one
scheduling iteration's input to a chunking policy; ``Chunk`` is its output:
``tokens`` prompt tokens of ``request_id`` starting at position ``start``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tetriserve.common.length import LengthEstimate
from tetriserve.common.sola_state import Observed


@dataclass(frozen=True)
class ReqView:
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_time: float
    estimate: LengthEstimate | None = None
    priority: int = 0
    computed_tokens: int = 0  # l_has: prompt tokens already prefilled (a chunked prompt in progress)
    ttft_slo_s: float | None = None
    jct_slo_s: float | None = None
    tbt_slo_s: float | None = None  # its time-between-tokens SLO (a request already decoding: a TG task)
    queued_since: float | None = None  # when it (re-)entered the queue: arrival, or the end of its last chunk
    batch_seq: int = 0  # which PrefillSchedBatch moved it to the scheduled queue (0 while in the raw queue)
    # whether a decode worker may compute its prompt instead (prefill.offload_wait_s): not when it ends at its
    # first token, nor with seeded sampling, whose draws would then differ from those of the usual path
    offloadable: bool = False

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.prompt_len - self.computed_tokens)

    @property
    def in_progress(self) -> bool:
        return 0 < self.computed_tokens < self.prompt_len

    def kv_held(self, block_size: int) -> int:
        """KV slots, in whole blocks of ``block_size`` tokens, that its computed tokens hold."""
        return math.ceil(self.computed_tokens / block_size) * block_size

    def expected_output(self) -> int:
        """Predicted output tokens S_g (the length predictor's estimate when there is one, else ``max_tokens``)."""
        return min(self.estimate.estimate, self.max_tokens) if self.estimate is not None else self.max_tokens

    def kv_tokens_upper(self) -> int:
        """Tokens of KV this request may hold on its decode worker (prompt + predicted upper output)."""
        out = self.estimate.upper if self.estimate is not None else self.max_tokens
        return self.prompt_len + min(out, self.max_tokens)

    def kv_blocks_upper(self, block_size: int) -> int:
        return math.ceil(self.kv_tokens_upper() / block_size)

    def is_heavy(self, threshold_tokens: int) -> bool:
        est = self.estimate.estimate if self.estimate is not None else self.max_tokens
        return est >= threshold_tokens


@dataclass(frozen=True)
class Chunk:
    request_id: str
    start: int  # first prompt position computed in this iteration (= l_has)
    tokens: int  # l_in

    @property
    def end(self) -> int:
        return self.start + self.tokens


@dataclass(frozen=True)
class PrefillState:
    """One iteration's input to a chunking policy."""

    ordered: tuple[ReqView, ...]  # the queue policy's order; requests already in progress included
    max_budget: int  # the engine's ceiling on tokens per iteration
    block_size: int = 32
    free_kv_blocks: int | None = None  # None: the engine did not say (no KV-aware selection)
    remaining_time: Mapping[str, float] = field(default_factory=dict)  # AccelGen T_r, when the queue policy has it
    urgent_s: float = 0.0  # a request with T_r at or below this must run in this iteration (AccelGen T_max)
    # the other members of the engine's batch that hold KV and are not in ``ordered``: the requests already
    # decoding on a colocated engine (AccelGen's TG tasks), which Alg. 1 may preempt; their T_r is in
    # ``remaining_time`` too. Empty on a prefill engine, whose batch is its prompts.
    batch: tuple[ReqView, ...] = ()
    now: float = 0.0  # the iteration's time, the clock of ``ReqView.arrival_time``
    decoding: tuple[Observed, ...] = ()  # the requests decoding on the same engine (colocated), for SOLA's monitor
    total_kv_blocks: int | None = None  # the engine's KV blocks in all (None: not said)
