"""Frozen views that prefill-side policies decide from (DESIGN.md §4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.length import LengthEstimate


@dataclass(frozen=True)
class ReqView:
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_time: float
    estimate: LengthEstimate | None = None
    priority: int = 0

    def kv_tokens_upper(self) -> int:
        """Tokens of KV this request may hold on its decode worker (prompt + predicted upper output)."""
        out = self.estimate.upper if self.estimate is not None else self.max_tokens
        return self.prompt_len + min(out, self.max_tokens)

    def kv_blocks_upper(self, block_size: int) -> int:
        return math.ceil(self.kv_tokens_upper() / block_size)

    def is_heavy(self, threshold_tokens: int) -> bool:
        est = self.estimate.estimate if self.estimate is not None else self.max_tokens
        return est >= threshold_tokens
