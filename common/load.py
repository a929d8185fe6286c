"""Load reports sent to the ClusterMonitor (TetriInfer §3.2).

A worker looks at its load every ``report_interval_ms`` and sends it when it has
changed (``same_load``), or else once every ``heartbeat_interval_ms``: an idle
cluster costs a few messages a second, not tens. Decode loads are broadcast to
every prefill worker, whose dispatcher decides locally from that view (§3.3.4).
A report is also the worker's heartbeat: it carries the worker's ``incarnation``
(reports of a previous life are dropped) and its engine's step counter with
whether the engine has work, so the monitor can tell a stuck engine from a live
one by its own clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


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
    incarnation: int = 0
    steps: int = 0  # engine steps so far
    busy: bool = False  # the engine has requests (so ``steps`` must move)
    queue_wait_s: float = 0.0  # expected seconds to prefill what is queued here (prefill_worker/pace.py)
    seconds_per_token: float = 0.0  # measured prefill pace (0: not measured yet)


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
    incarnation: int = 0
    steps: int = 0  # engine steps so far
    busy: bool = False  # the engine has requests (so ``steps`` must move)


def same_load(a: PrefillLoad | DecodeLoad | None, b: PrefillLoad | DecodeLoad | None) -> bool:
    """Whether two reports say the same but for when they were taken and how far the engine has stepped (a
    heartbeat carries those; a changed load goes out at once)."""
    if a is None or b is None or type(a) is not type(b):
        return False
    if isinstance(a, PrefillLoad) and isinstance(b, PrefillLoad):  # the pace drifts: not a change of load
        a, b = replace(a, seconds_per_token=0.0), replace(b, seconds_per_token=0.0)
    return replace(a, at=0.0, steps=0) == replace(b, at=0.0, steps=0)
