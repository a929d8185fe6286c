"""The decode engine's per-step decisions, with no engine in sight: what to admit, whom to preempt first, which
marked requests end their slice, how long a step takes, and what preemption cost.

    views of the waiting requests ─▶ admit(waiting, state)    ─▶ Admission(admitted, held)
    what the running batch needs   ─▶ may_run_out(needs, free) ─▶ bool
    views of the running batch     ─▶ victims(running)         ─▶ ids, the first to preempt first
                                      (where reorders(len(running)))
    marked requests' progress      ─▶ slice_cuts(progress)     ─▶ ids that end their slice this step
    a step's start time            ─▶ observe_step(now, busy)  ─▶ the smoothed step time
    a preemption / a resumption    ─▶ preempted(...), resumed(...) ─▶ PreemptionStats

A ``DecodePlanner`` holds the configured policies (the admission policy, TetriInfer §3.4 / CacheOpt §3.2 /
SOLA §5.1; the preemption order, CacheOpt §3.4; swap or recompute, CacheOpt §3.5) and the little state the
decisions need across steps. It takes the time as an argument and reads no clock, so tests (and a simulated
engine) drive it with their own; ``decode_worker/vllm_scheduler.py`` translates vLLM's queues into views, and
the decisions back into vLLM's terms.

Admission asks each waiting request in the policy's order, folding each admitted one into the state before
the next is asked; the first refusal holds it and every request after it for this step (admission keeps the
policy's order: a later, smaller request does not pass a refused one).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tetriserve.decode_worker.admission import AdmissionPolicy, make_admission_policy
from tetriserve.decode_worker.preemption import PreemptionOrder, PreemptionStrategy, make_preemption_order
from tetriserve.decode_worker.preemption.stats import PreemptionStats
from tetriserve.decode_worker.views import DecodeReqView, DecodeState

STEP_SMOOTHING = 0.2  # weight of the newest step in the step-time average
# busy steps the longest step time is taken over (CacheOpt §3.3.2's T_I^max, "historically observed"): a window,
# so that one slow step (a first step, a swap) does not make every waiting request critical for good
STEP_MAX_WINDOW = 256


@dataclass(frozen=True)
class Admission:
    """One step's admission: the requests that may start decoding, and those held until the next step."""

    admitted: tuple[str, ...]
    held: tuple[str, ...]


@dataclass(frozen=True)
class SliceProgress:
    """A request marked to move at its next slice boundary (SCLS §7), as this step finds it."""

    request_id: str
    produced: int  # tokens it will have generated here with this step's
    decoding: bool  # in the running batch with its whole context computed (this step makes one token)
    max_tokens: int


@dataclass
class DecodePlanner:
    admission: AdmissionPolicy = field(default_factory=lambda: make_admission_policy("greedy"))
    victim_order: PreemptionOrder = field(default_factory=lambda: make_preemption_order("vllm"))
    strategy: PreemptionStrategy = field(default_factory=lambda: PreemptionStrategy("recompute"))
    slice_iters: int = 0  # SCLS slice length S; 0: no request ends at a slice boundary
    step_s: float = 0.0  # smoothed time between the starts of busy steps
    stats: PreemptionStats = field(default_factory=PreemptionStats)
    _last_step: float = 0.0
    _gaps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_MAX_WINDOW))
    _out: dict[str, tuple[float, int]] = field(default_factory=dict)  # preempted id -> (when, tokens computed)

    # -- the step time ------------------------------------------------------------------------------------
    def observe_step(self, now: float, busy: bool) -> float:
        """A step starts at ``now``; ``busy``: requests were running since the last one. The smoothed gap
        between steps of a busy engine is the step time the policies read (SOLA's t^TPOT, CacheOpt's TBT
        slack)."""
        if self._last_step and busy:
            gap = now - self._last_step
            self.step_s = gap if not self.step_s else (1 - STEP_SMOOTHING) * self.step_s + STEP_SMOOTHING * gap
            self._gaps.append(gap)
        self._last_step = now
        return self.step_s

    @property
    def max_step_s(self) -> float:
        """The longest of the last ``STEP_MAX_WINDOW`` busy steps (CacheOpt §3.3.2's T_I^max); 0 before any."""
        return max(self._gaps, default=0.0)

    # -- admission --------------------------------------------------------------------------------------
    def admit(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> Admission:
        """Ask the admission policy about each waiting request, in its order; the first refusal holds the rest."""
        admitted: list[str] = []
        held: list[str] = []
        for view in self.admission.order(list(waiting), state):
            if not held and self.admission.admit(view, state):
                state = state.with_admitted(view)
                admitted.append(view.request_id)
            else:
                held.append(view.request_id)
        return Admission(tuple(admitted), tuple(held))

    # -- preemption -------------------------------------------------------------------------------------
    @staticmethod
    def may_run_out(tokens_left: Sequence[int], free_blocks: int, block_size: int) -> bool:
        """Whether this step's allocations could exceed the free blocks. ``tokens_left``: per running request,
        the tokens it has yet to compute; a decoding request (≤ 1 left) needs at most one new block, one still
        prefilling (recomputing after a preemption) at most its remaining tokens' blocks and one more."""
        need = sum(1 if left <= 1 else math.ceil(left / block_size) + 1 for left in tokens_left)
        return need > free_blocks

    def reorders(self, running: int) -> bool:
        """Whether the preemption order differs from the engine's own (tail-first) for a batch of ``running``:
        not under the ``vllm`` order, nor with fewer than two running."""
        return self.victim_order.name != "vllm" and running >= 2

    def victims(self, running: Sequence[DecodeReqView]) -> list[str]:
        """The running requests' ids in the order they are to be preempted, the first first."""
        return [v.request_id for v in self.victim_order.victims(list(running))]

    def preempted(self, request_id: str, computed: int, now: float, can_swap: bool) -> str:
        """A request is preempted with ``computed`` tokens of KV: "swap" or "recompute" (the strategy's choice,
        recompute where nothing is computed or the engine cannot swap), counted and timed until it resumes."""
        self.stats.count += 1
        how = self.strategy.choose(computed) if computed > 0 and can_swap else "recompute"
        if how == "swap":
            self.stats.swapped += 1
        else:
            self.stats.recomputed += 1
        self._out[request_id] = (now, computed)
        return how

    def resumed(self, computed: Mapping[str, int | None], now: float) -> tuple[str, ...]:
        """``computed``: for each preempted request, the tokens it has computed while running again, or None
        where it is not running (or gone). One back to its earlier progress has resumed; one gone is dropped.
        Returns the ids that resumed."""
        back: list[str] = []
        for rid, (since, tokens) in list(self._out.items()):
            if rid not in computed:  # finished or aborted while out
                del self._out[rid]
                continue
            now_computed = computed[rid]
            if now_computed is not None and now_computed >= tokens:
                self.stats.durations_s.append(now - since)
                del self._out[rid]
                back.append(rid)
        return tuple(back)

    @property
    def preempted_ids(self) -> tuple[str, ...]:
        return tuple(self._out)

    def preempted_at(self, request_id: str) -> float | None:
        """When ``request_id`` was preempted, while it is out (its latest token came then); None otherwise."""
        out = self._out.get(request_id)
        return out[0] if out is not None else None

    # -- SCLS slices ------------------------------------------------------------------------------------
    def slice_cuts(self, progress: Sequence[SliceProgress]) -> list[str]:
        """The marked requests that reach a slice boundary with this step's token: decoding, at a multiple of
        ``slice_iters`` tokens, and short of their own end (which finishes them anyway)."""
        if self.slice_iters <= 0:
            return []
        return [
            p.request_id
            for p in progress
            if p.decoding and p.produced % self.slice_iters == 0 and p.produced < p.max_tokens
        ]
