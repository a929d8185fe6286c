"""Load reports sent to the ClusterMonitor (TetriInfer §3.2).

A worker looks at its load every ``report_interval_ms`` and sends it when it has
changed (``same_load``), or else once every ``heartbeat_interval_ms``: an idle
cluster costs a few messages a second, not tens. A load under steady traffic
drifts at every look (a token generated, a chunk prefilled), so its quantities
have a deadband (``report_tolerance``): one that moved by less than that share
of its value since the last report is no change, and goes out with the next
heartbeat. Each report and broadcast is a Ray call that costs CPU in the
sender, the monitor and the receivers (the GlobalScheduler, every prefill
worker), on the cores the prefill engines share. Decode loads are broadcast
to every prefill worker, whose dispatcher decides locally from that view
(§3.3.4). A report is also the
worker's heartbeat: it carries the worker's ``incarnation`` (reports of a
previous life are dropped) and its engine's step counter with whether the
engine has work, so the monitor can tell a stuck engine from a live one by its
own clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"  # one engine for both phases; reports a PrefillLoad and is placed on like one


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
    seconds_per_token: float = 0.0  # what a queued prompt token adds to queue_wait_s (pace.py; 0: not measured)
    total_kv_blocks: int = 0  # the blocks its KV cache holds (what prefix placement's estimate is bounded by)


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
    prompt_room: int = 0  # offloaded prompts it takes now (decode.max_local_prompts less those it computes)


DEFAULT_REPORT_TOLERANCE = 0.1
# Fields a heartbeat carries but that are no change of load: when it was taken, how far the engine has stepped,
# and the measured paces (they drift with every step).
_DRIFT = frozenset({"at", "steps", "step_s", "seconds_per_token"})
# Quantities compared with the deadband; every other field (the worker, its life, whether it accepts or has
# work, its KV geometry, its slice length) must be equal.
_QUANTITIES = frozenset(
    {
        "queued",
        "running",
        "queued_prompt_tokens",
        "queue_wait_s",
        "free_kv_blocks",
        "heavy",
        "light",
        "remaining_tokens",
    }
)


def _close(x: float, y: float, tolerance: float) -> bool:
    return x == y or abs(x - y) < tolerance * max(abs(x), abs(y))


def same_load(a: PrefillLoad | DecodeLoad | None, b: PrefillLoad | DecodeLoad | None, tolerance: float = 0.0) -> bool:
    """Whether two reports say the same but for what drifts (``_DRIFT``; a heartbeat carries it) and quantities
    that moved by less than ``tolerance`` of the larger of the two values (0: any move is a change). A change
    from or to zero is always one."""
    if a is None or b is None or type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in _DRIFT:
            continue
        if not (_close(x, y, tolerance) if f.name in _QUANTITIES else x == y):
            return False
    return True
