"""Prompts this prefill worker does not compute: a decode worker with room computes them itself (conditional
disaggregation, a departure from TetriInfer §3.3, where prefill instances compute every prompt).

- ``offer_short``: a prompt of at most ``prefill.offload_max_tokens`` tokens, before it queues: there it costs
  part of one decode step, here a turn in the queue, the engine's prefill and the KV handoff.
- ``offer_prompts``: while the prompts queued here would take longer than ``prefill.offload_wait_s`` for this
  worker's engine to prefill (``pace.prefill_s``), the next in line, in line order: one that stays holds the
  line. Its ``turn`` raises ``Offloaded`` and its task hands it over.

The offer takes the decode worker's room at once (``DecodeDirectory.prompt_room``); the request's ``take``
(``prefill_here``) then asks it, and one refused waits here again.
"""

from __future__ import annotations

import asyncio
import logging

from tetriserve.channel.handoff import Take
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.errors import actor_died
from tetriserve.prefill_worker.admission import Offloaded, SchedBatchGate
from tetriserve.prefill_worker.decode_peers import DecodePeer
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.lifecycle import PrefillJob
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.policy import PrefillPolicySpec
from tetriserve.prefill_worker.views import ReqView

logger = logging.getLogger(__name__)


class Offloader:
    def __init__(
        self,
        worker_id: str,
        gate: SchedBatchGate,
        pace: PrefillPace,
        directory: DecodeDirectory,
        cost: CostEstimator | None,
        spec: PrefillPolicySpec,
        wait_s: float,
    ) -> None:
        """``wait_s``: ``prefill.offload_wait_s`` (0: no backlog is offered); ``spec``: the queue policy's, replaced
        by ``set_spec`` when it changes at run time."""
        self.worker_id, self.gate, self.pace, self.directory, self.cost = worker_id, gate, pace, directory, cost
        self.spec, self.wait_s = spec, wait_s
        self.backlogged = False  # the engine's time for the queue, last priced, was over ``wait_s``

    def set_spec(self, spec: PrefillPolicySpec) -> None:
        self.spec = spec

    def prefill_s(self, lens: list[int]) -> float:
        """The engine's time for the queued prompts of lengths ``lens``; whether it is over ``wait_s`` is noted
        for the local share (``pace.left_queue``)."""
        prefill_s = self.pace.prefill_s(lens, self.cost, self.spec.chunk_size)
        self.backlogged = 0 < self.wait_s < prefill_s
        return prefill_s

    def offer_short(self, view: ReqView) -> str | None:
        """The decode worker to offer a short prompt before it queues, if one has room (the room taken); None:
        it queues here."""
        if view.offloadable and view.prompt_len <= self.spec.offload_max_tokens:
            return self.directory.prompt_room(view)
        return None

    def offer_prompts(self) -> None:
        """Offer the next in line of a backlog while the queue would take longer than ``wait_s``."""
        if self.wait_s <= 0:
            return
        wait = self.prefill_s(self.gate.queued_lens())
        while wait > self.wait_s and (view := self.gate.next_in_line()) is not None:
            decode_id = self.directory.prompt_room(view) if view.offloadable else None
            if decode_id is None:  # in line order: one that stays holds the line
                return
            self.gate.cancel(view.request_id, Offloaded(decode_id))
            wait -= self.pace.prefill_s([view.prompt_len], self.cost, self.spec.chunk_size)

    async def run(self, interval_s: float) -> None:
        """Forever: offer the backlog every ``interval_s`` (the broadcasts offer it too, as loads change)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.offer_prompts()
            except Exception:
                logger.exception("prefill %s: offering prompts to decode workers failed", self.worker_id)

    async def take(self, job: PrefillJob, decode_id: str) -> DecodePeer | None:
        """Ask ``decode_id`` to compute ``job``'s prompt; its peer if it took the request, None if it refused (no
        room there any more) or is gone (found dead: passed over from now on)."""
        peer = self.directory.peer(decode_id)
        if peer is None:
            return None
        try:
            taken = await peer.take(Take(job.req, job.req.resume, job.subscriber, prefill_here=True))
        except Exception as exc:  # died since the broadcast
            if actor_died(exc):
                self.directory.died(decode_id)
            return None
        return peer if taken else None
