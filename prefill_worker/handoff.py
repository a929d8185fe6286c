"""The prefill worker's handoff to a decode worker (TetriInfer §3.3.3-§3.3.4): choose one with the dispatcher,
send it the parked KV (whole, or part by part in a pipelined handoff: ``pipeline.py``) or, on one host, have it
pull the KV from this worker's slabs (``transport/shm_pull.py``), give it the request. Or, for a prompt this
worker does not compute, give a decode worker the request to compute it itself (conditional disaggregation,
a departure from TetriInfer §3.3, where prefill instances compute every prompt): a short one before it queues
(``offer_short``), the next in line of a backlog (``offer_prompts``).

A decode worker found dead at ``take`` before any of the KV lent to it has left is passed over: the KV is lent
to another decode worker and the request goes on in the same attempt (``_take``). One whose KV was sent or
pipelined there ends the attempt, and the front door migrates the request.

A mixin of ``PrefillWorker`` (``worker.py``), whose state it uses: the decode workers' loads, addresses and
handles from the ClusterMonitor's broadcast, the dispatcher, the KV sends in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tetriserve.channel.handoff import Discard, PullKV, Refine, Take
from tetriserve.common.errors import actor_died
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason
from tetriserve.observability import tracing
from tetriserve.prefill_worker import spans
from tetriserve.prefill_worker.admission import Offloaded
from tetriserve.prefill_worker.dispatch.base import account
from tetriserve.prefill_worker.views import ReqView
from tetriserve.transport.api import TransferState

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tetriserve.prefill_worker.decode_peers import DecodePeer
    from tetriserve.prefill_worker.predictions import Ticket
    from tetriserve.prefill_worker.worker import PrefillWorker

    _Base = PrefillWorker
else:
    _Base = object


class Handoff(_Base):
    async def _refine(
        self, req: Request, decode: DecodePeer, refinement: asyncio.Future[LengthEstimate | None]
    ) -> None:
        """Give the decode worker ``req`` went to the prediction that was late for its handoff."""
        estimate = await self.predictions.later(refinement)
        if estimate is not None:
            decode.send(Refine(req.request_id, req.attempt, estimate))

    async def _hand_off(
        self,
        req: Request,
        generated: tuple[int, ...],
        view: ReqView,
        subscriber: str,
        chosen: tuple[str, str | None] | None = None,
    ) -> DecodePeer | None:
        """Send the parked KV to a decode worker and give it the request; returns that worker's peer, or None
        where the request did not go on: a failure the request may get past elsewhere ends this attempt with a
        ``retry`` error (the front door migrates it). ``chosen``: (decode worker, forwarding error) of a
        pipelined handoff, whose KV has gone already."""
        rid, key, index = req.request_id, req.kv_key, len(generated)
        decode_id, error = chosen if chosen is not None else (await self._choose_decode(view), None)
        tracing.annotate({"tetriserve.decode_worker": decode_id or "", "tetriserve.dispatch": self.dispatcher.name})
        pull_from = None  # where ``take`` tells the decode worker to pull the KV from, instead of being sent it
        if decode_id is None:
            error = "no decode worker is accepting requests"
        elif chosen is None and self._lent_to(key, decode_id):
            pull_from = self.endpoint.address
        elif chosen is None:
            error = await self._forward_kv(key, decode_id)
        if key in self._aborted:  # aborted after its first token, before the handoff
            del self._aborted[key]
            self.endpoint.discard(key)
            if chosen is not None and decode_id is not None:  # parts of its KV went there already
                self._decode_peers[decode_id].send(Discard(key))
            self.publish(subscriber, req, (), FinishReason.ABORT, index=index)
            return None
        if error is None and decode_id is not None:
            decode_id, taken, error = await self._take(req, generated, view, subscriber, decode_id, pull_from)
            decode = self._decode_peers[decode_id]
            if taken:
                self.handoffs["pipelined" if chosen is not None else "whole"] += 1
                self.handed_on(rid, decode.handle)
                if key in self._aborted:  # aborted while the decode worker took it: abort it there
                    del self._aborted[key]
                    self.forward_abort(rid, req.attempt)
                self.publish(subscriber, req, (), index=index, moved_to=decode_id)
                self.event(rid, RequestState.DECODE_QUEUED, decode_id, moved_to=decode_id)
                return decode
            if error is None:  # alive but not accepting: its copy of the KV goes
                error = f"decode worker {decode_id} refused the request"
                decode.send(Discard(key))
        elif chosen is not None and decode_id is not None:  # a pipelined send broke off: the parts there go
            self._decode_peers[decode_id].send(Discard(key))
            self.decode_loads.pop(decode_id, None)  # until the next broadcast says otherwise
        self.endpoint.discard(key)
        self.publish(subscriber, req, (), FinishReason.ERROR, error, index=index, retry=True)
        return None

    # -- prompts offloaded to decode workers (conditional disaggregation) ----------------
    async def _offload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_interval_ms / 1000)
            try:
                self.offer_prompts()
            except Exception:
                logger.exception("prefill %s: offering prompts to decode workers failed", self.worker_id)

    def offer_prompts(self) -> None:
        """While the prompts queued here would take longer than ``prefill.offload_wait_s`` for this worker's engine
        to prefill (``pace.prefill_s``), offer the next in line to a decode worker with room to compute it: its
        ``turn`` raises ``Offloaded`` and its task hands it over (``Handoff._offload``)."""
        threshold = self.config.prefill.offload_wait_s
        if threshold <= 0:
            return
        chunk = self.policy.spec.chunk_size
        wait = self._prefill_s(self.gate.queued_lens())
        while wait > threshold and (view := self.gate.next_in_line()) is not None:
            decode_id = self._prompt_room(view) if view.offloadable else None
            if decode_id is None:  # in line order: one that stays holds the line
                return
            self.gate.cancel(view.request_id, Offloaded(decode_id))
            wait -= self.pace.prefill_s([view.prompt_len], self.cost, chunk)

    def offer_short(self, view: ReqView) -> str | None:
        """The decode worker to offer a prompt of at most ``offload_max_tokens`` tokens (``view.prompt_len``; the
        config's ``prefill.offload_max_tokens``, or as ``set_policy`` changed it), before it queues, if one has
        room to compute it (the room taken): there it costs part of one step, here a turn in the queue, the
        engine's prefill and the KV handoff. None: it queues here."""
        if view.offloadable and view.prompt_len <= self.policy.spec.offload_max_tokens:
            return self._prompt_room(view)
        return None

    def _prompt_room(self, view: ReqView) -> str | None:
        """The decode worker with the most room to compute ``view``'s prompt (its ``prompt_room``,
        ``decode.max_local_prompts``, by the broadcast loads less the offers made since), the room taken; None:
        none has room."""
        room = [
            d
            for d in self.decode_loads.values()
            if d.accepting and d.prompt_room > 0 and d.worker_id in self._decode_peers
        ]
        if not room:
            return None
        decode_id = min(room, key=lambda d: (-d.prompt_room, d.running + d.queued, d.worker_id)).worker_id
        self._account(decode_id, view)
        offered = self.decode_loads[decode_id]
        self.decode_loads[decode_id] = replace(offered, prompt_room=offered.prompt_room - 1)
        return decode_id

    async def _offload(self, req: Request, subscriber: str, ticket: Ticket, decode_id: str) -> bool:
        """Give ``req``, not computed here, to ``decode_id`` to compute its prompt there (``offer_prompts``,
        ``offer_short``); True if it took it, or the request was aborted meanwhile (ended here). Refused (no room
        there any more, or gone), the request waits here again; a prediction not started by then is dropped (the
        instant estimate goes with it at its handoff), as for a handoff that does not wait."""
        rid, key = req.request_id, req.kv_key
        estimate, refinement = await self.predictions.estimate(ticket)
        peer = self._decode_peers.get(decode_id)
        taken = False
        try:
            if peer is not None:
                taken = await peer.take(Take(req, req.resume, estimate, subscriber, prefill_here=True))
        except Exception as exc:  # died since the broadcast
            if actor_died(exc):
                self.decode_died(decode_id)
        aborted = key in self._aborted
        self._aborted.pop(key, None)
        if not taken:
            if aborted:
                self.publish(subscriber, req, (), FinishReason.ABORT, index=len(req.resume))
            return aborted
        self.handoffs["offloaded"] += 1
        self.handed_on(rid, peer.handle)
        if aborted:  # aborted while the decode worker took it: abort it there
            self.forward_abort(rid, req.attempt)
        self.publish(subscriber, req, (), index=len(req.resume), moved_to=decode_id)
        self.event(rid, RequestState.DECODE_QUEUED, decode_id, moved_to=decode_id)
        if refinement is not None:
            task = asyncio.create_task(self._refine(req, peer, refinement))
            self._refining.add(task)
            task.add_done_callback(self._refining.discard)
        return True

    async def _take(
        self,
        req: Request,
        generated: tuple[int, ...],
        view: ReqView,
        subscriber: str,
        decode_id: str,
        pull_from: str | None,
    ) -> tuple[str, bool, str | None]:
        """``take`` on ``decode_id``: (the decode worker it ended with, taken, error). One that turns out dead
        before any of the KV lent to it has left is passed over: the KV is lent to another decode worker (waited
        for as ``_choose_decode`` does) and the request goes there, still in this attempt. A KV sent or pipelined
        there is gone with it: that attempt ends (the front door migrates the request)."""
        key = req.kv_key
        while True:
            try:
                taken = await self._decode_peers[decode_id].take(
                    Take(req, generated, view.estimate, subscriber, pull_from)
                )
                return decode_id, taken, None
            except Exception as exc:  # the decode worker died between the broadcast and now
                error = f"decode worker {decode_id} is unavailable ({type(exc).__name__})"
                if not actor_died(exc):
                    return decode_id, False, error
            self.decode_died(decode_id)
            lent = self._sends.get(key)
            if pull_from is None or lent is None or lent[0].nbytes:
                return decode_id, False, error
            other = await self._choose_decode(view)  # none serving: waits, the lending's deadline running
            address = self.decode_addresses.get(other or "", "")
            if other is None or key in self._aborted or not self.endpoint.lends_to(address):
                return decode_id, False, error
            if lent[0].state is not TransferState.PENDING:  # over: its deadline passed, perhaps while waiting
                return decode_id, False, error
            logger.warning("prefill %s: %s (%s); its KV goes to %s instead", self.worker_id, error, key, other)
            self._sends[key] = (lent[0], other)  # a failed pull is told to the one pulling now
            decode_id = other

    def pulled_by(self, decode_id: str, key: str) -> bool:
        """Have ``decode_id`` pull ``key``'s KV from this endpoint now, each part as it is published, where it
        can (an shm endpoint of this host: ``transport/shm_pull.py``); False: it must be sent."""
        if not self._lent_to(key, decode_id):
            return False
        self._decode_peers[decode_id].send(PullKV(self.endpoint.address, key))
        return True

    def _lent_to(self, key: str, decode_id: str) -> bool:
        """Whether ``decode_id`` can pull ``key`` from here; if so its pull is watched like a send (its span, and
        a failure told to the decode worker)."""
        if not self.endpoint.lends_to(self.decode_addresses.get(decode_id, "")):
            return False
        self.sent_kv(key, self.endpoint.lending(key, self.config.transport.timeout_s), decode_id)
        return True

    async def _forward_kv(self, key: str, decode_id: str) -> str | None:
        """Send the parked KV to the chosen decode worker; returns an error message or None. A send that fails
        later is reported to that decode worker at once (``kv_failed``), so it does not wait out the deadline."""
        buffers = await self.parked_kv(key, lambda: key in self._aborted)  # parked with the first token
        if buffers is None:
            return f"prefilled KV of {key} was not found on {self.worker_id}"
        address = self.decode_addresses[decode_id]
        self.sent_kv(key, self.endpoint.send(address, key, buffers, self.config.transport.timeout_s), decode_id)
        return None

    def sent_kv(self, key: str, handle: Any, decode_id: str) -> None:
        """Watch a KV send (``key``: a request's, or one part of it) to ``decode_id`` until it completes."""
        self._sends[key] = (handle, decode_id)
        address = self.decode_addresses.get(decode_id, "")
        spans.sending(self._send_spans, key, tracing.now_ns(), handle.nbytes, address, decode_id)

    def decode_peer(self, decode_id: str) -> DecodePeer | None:
        return self._decode_peers.get(decode_id)

    @property
    def aborted_keys(self) -> dict[str, None]:
        """KV keys of the requests aborted after they left the engine (or while it still prefilled them)."""
        return self._aborted

    def decode_died(self, decode_id: str) -> None:
        """A call of ours found ``decode_id``'s current life dead: dispatch passes over it from now on, and the
        monitor hears of it at once, so its next broadcast drops it for every prefill worker before the supervisor
        has noticed (``_found_dead`` ignores broadcasts of that life already on their way)."""
        known = self.decode_loads.pop(decode_id, None)
        if known is None:  # found already, or no longer in the view: not ours to judge
            return
        self._dead_decodes[decode_id] = known.incarnation
        peer = self._decode_peers.get(decode_id)
        if peer is not None:  # a later life comes with a peer of its own
            peer.close()
        if self._monitor is not None:
            self._monitor.mark_dead.remote(decode_id, known.incarnation)

    def pick_decode(self, view: ReqView) -> str | None:
        """A decode worker for ``view`` now, if the dispatcher finds one (accounted for in the local view)."""
        choice = self.dispatcher.choose(view, list(self.decode_loads.values()), self.rng)
        if choice is None or choice not in self.decode_addresses:
            return None
        self._account(choice, view)
        return choice

    async def _choose_decode(self, view: ReqView) -> str | None:
        """A decode worker for ``view``; while none serves (all restarting), wait up to ``placement_timeout_s``
        with the KV parked here rather than give the request up."""
        deadline = time.monotonic() + self.config.placement_timeout_s
        while (choice := self.pick_decode(view)) is None:
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self.config.report_interval_ms / 1000)
        return choice

    def _account(self, worker_id: str, view: ReqView) -> None:
        """Update the local copy of the broadcast view so bursts between broadcasts do not herd."""
        self.decode_loads[worker_id] = account(
            self.decode_loads[worker_id], view, self.config.prefill.heavy_threshold_tokens
        )
