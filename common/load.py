"""Load reports sent to the ClusterMonitor every ``report_interval_ms`` (TetriInfer §3.2).

Decode loads are broadcast to every prefill worker, whose dispatcher decides
locally from that view (§3.3.4).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class PrefillLoad:
    worker_id: str
    queued: int
    running: int
    queued_prompt_tokens: int
    at: float


@dataclass(frozen=True)
class DecodeLoad:
    worker_id: str
    free_kv_blocks: int
    total_kv_blocks: int
    block_size: int
    running: int
    queued: int
    heavy: int
    light: int
    at: float
    accepting: bool = True
    remaining_tokens: int = 0  # Σ predicted tokens still to generate (running + queued): SCLS max-min's load
    step_s: float = 0.0  # recent decode iteration time (0 while idle)
    slice_iters: int = 0  # SCLS slice length S; 0: its requests are never moved elsewhere
