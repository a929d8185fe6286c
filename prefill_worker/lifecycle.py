"""One request's life on a prefill worker, as an explicit state machine (TetriInfer §3.3, with the conditional
disaggregation of ``offload.py``):

    QUEUED ──turn──▶ COMPUTING ──first token, KV parked──▶ PARKED ──take──▶ HANDED
      │                 │                                   │
      │ offered          └─ the engine ended it ─▶ FINISHED  └─ refused, send failed, no decode ─▶ FAILED
      ▼
    OFFLOADED (a decode worker computes the prompt)

    ABORTED from every state before HANDED / OFFLOADED / FINISHED; FAILED from every one before an end

An abort that comes while the request is between two places (waiting on an offer's ``take``, a KV send, the
prediction) is not lost: ``abort_requested`` is set and the step that comes next ends the request there
(``PrefillWorker``). Pure: no Ray, no engine, no clock.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tetriserve.common.request import Request
from tetriserve.prefill_worker.views import ReqView

if TYPE_CHECKING:
    from tetriserve.prefill_worker.pipeline import EarlyHandoff
    from tetriserve.prefill_worker.predictions import Ticket


class Phase(enum.Enum):
    QUEUED = "queued"  # waiting for its PrefillSchedBatch turn (or for an offer made before it queued)
    COMPUTING = "computing"  # in the engine's chunked prefill
    PARKED = "parked"  # first token out, KV parked in this worker's endpoint: the handoff runs
    HANDED = "handed"  # a decode worker took it with the KV
    OFFLOADED = "offloaded"  # a decode worker took it to compute the prompt itself
    FINISHED = "finished"  # ended at prefill (max_tokens 1, a stop, an engine error)
    ABORTED = "aborted"
    FAILED = "failed"  # a handoff that did not complete (the front door migrates it), or a bug of ours


ENDS = frozenset({Phase.HANDED, Phase.OFFLOADED, Phase.FINISHED, Phase.ABORTED, Phase.FAILED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.COMPUTING, Phase.OFFLOADED, Phase.ABORTED, Phase.FAILED}),
    Phase.COMPUTING: frozenset({Phase.PARKED, Phase.FINISHED, Phase.ABORTED, Phase.FAILED}),
    Phase.PARKED: frozenset({Phase.HANDED, Phase.ABORTED, Phase.FAILED}),
    **{end: frozenset() for end in ENDS},
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class PrefillJob:
    """A request on this worker: what it is, who streams it, where it stands, and what of its handoff has begun.
    ``view`` is the policies' view of it, its length estimate added once the handoff has one."""

    req: Request
    subscriber: str
    view: ReqView
    phase: Phase = Phase.QUEUED
    abort_requested: bool = False
    history: list[Phase] = field(default_factory=lambda: [Phase.QUEUED])
    queued_ns: int = 0  # when it reached this worker (its spans' start; the worker's clock, not the machine's)
    task: asyncio.Task[None] | None = None  # the task that drives it (``PrefillWorker._serve``)
    ticket: Ticket | None = None  # its length prediction, while no step has taken the estimate on
    early: EarlyHandoff | None = None  # its pipelined handoff, from COMPUTING until the handoff takes it over

    @property
    def key(self) -> str:
        return self.req.kv_key

    @property
    def done(self) -> bool:
        return self.phase in ENDS

    @property
    def decodes(self) -> bool:
        """Whether it goes on to decode (else it ends at its first token, here): only then is its KV parked, its
        length predicted and a decode worker chosen."""
        return self.view.max_tokens > 1

    @property
    def index(self) -> int:
        """Where its next streamed token stands in the response (a migrated request resumes past its tokens)."""
        return len(self.req.resume)

    def advance(self, to: Phase) -> None:
        if to not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"request {self.req.request_id}: {self.phase.value} -> {to.value}")
        self.phase = to
        self.history.append(to)

    def end(self, to: Phase) -> None:
        """End it at ``to`` unless it has ended already (an abort and the step it interrupted can both get here)."""
        if not self.done:
            self.advance(to)


def view_of(req: Request) -> ReqView:
    """What the policies see of ``req`` on a prefill worker: its prompt (and, for a migrated request, the tokens
    the client already has), what is left to generate, its SLOs; offloadable where it decodes and its sampling
    does not pin it here (a seeded sample must be drawn by one engine)."""
    done = len(req.resume)
    decodes = req.sampling.max_tokens - done > 1
    seeded = req.sampling.seed is not None and req.sampling.temperature > 0
    return ReqView(
        req.kv_key,
        len(req.prompt_token_ids) + done,
        req.sampling.max_tokens - done,
        req.arrival_time,
        priority=req.priority,
        ttft_slo_s=req.slo.ttft_ms / 1000 if req.slo.ttft_ms else None,
        jct_slo_s=req.slo.jct_ms / 1000 if req.slo.jct_ms else None,
        offloadable=decodes and not seeded,
    )
