"""The handoff of a parked request to a decode worker (TetriInfer §3.3.3-§3.3.4): choose one with the
dispatcher (``directory.py``), move the parked KV there (``kv_sends.py``: sent whole, already pipelined by
``pipeline.py``, or lent to a decode worker on this host that pulls it), and give it the request (``Take``).

A decode worker found dead at ``take`` before any of the KV lent to it has been read is passed over: the lending
goes to another decode worker and the request goes on in the same attempt. One whose KV was sent or pipelined
there ends the attempt, and the front door migrates the request.

The handoff moves KV and asks decode workers; what the request's stream and the GlobalScheduler hear of the
outcome is the worker's (``PrefillWorker``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tetriserve.channel.handoff import Discard, Refine, Take
from tetriserve.common.config import ClusterConfig
from tetriserve.common.errors import actor_died
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request
from tetriserve.observability import tracing
from tetriserve.prefill_worker.decode_peers import DecodePeer
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.kv_sends import KVSender
from tetriserve.prefill_worker.lifecycle import PrefillJob
from tetriserve.prefill_worker.predictions import PredictionQueue
from tetriserve.transport.api import Received, Transport

logger = logging.getLogger(__name__)

ParkedKV = Callable[[str, Callable[[], bool]], Awaitable[list[Received] | None]]


@dataclass(frozen=True)
class Handed:
    decode_id: str
    peer: DecodePeer
    pipelined: bool  # its KV left while it computed


@dataclass(frozen=True)
class NotHanded:
    error: str | None  # None: it was aborted meanwhile


class Handoff:
    def __init__(
        self,
        config: ClusterConfig,
        endpoint: Transport,
        directory: DecodeDirectory,
        sender: KVSender,
        predictions: PredictionQueue,
        parked_kv: ParkedKV,
    ) -> None:
        """``parked_kv(key, give_up)``: the KV the engine parked under ``key`` once it is there (None: not)."""
        self.config, self.endpoint, self.directory, self.sender = config, endpoint, directory, sender
        self.predictions, self._parked_kv = predictions, parked_kv
        self._refining: set[asyncio.Task[None]] = set()  # late predictions on their way to decode workers

    async def choose(self, job: PrefillJob) -> str | None:
        """A decode worker for ``job``; while none serves (all restarting), wait up to ``placement_timeout_s``
        with the KV parked here rather than give the request up."""
        poll_s = self.config.report_interval_ms / 1000
        return await self.directory.choose(job.view, self.config.placement_timeout_s, poll_s)

    async def run(
        self, job: PrefillJob, generated: tuple[int, ...], chosen: tuple[str, str | None] | None
    ) -> Handed | NotHanded:
        """Hand parked ``job`` (its prompt, and the tokens ``generated`` so far) to a decode worker. ``chosen``:
        (decode worker, forwarding error) of a pipelined handoff, whose KV has gone already. Where it does not go
        on, its KV here is dropped, and any part of it sent on is dropped there."""
        key = job.key
        decode_id, error = chosen if chosen is not None else (await self.choose(job), None)
        tracing.annotate(
            {"tetriserve.decode_worker": decode_id or "", "tetriserve.dispatch": self.directory.dispatcher.name}
        )
        pull_from = None  # where ``take`` tells the decode worker to pull the KV from, instead of being sent it
        if decode_id is None:
            error = "no decode worker is accepting requests"
        elif chosen is None and self.sender.lend(key, decode_id):
            pull_from = self.endpoint.address
        elif chosen is None:
            error = await self._send(job, decode_id)
        if job.abort_requested:  # aborted after its first token, before the handoff
            self.endpoint.discard(key)
            if chosen is not None and decode_id is not None:  # parts of its KV went there already
                self._discard_at(decode_id, key)
            return NotHanded(None)
        if error is None and decode_id is not None:
            decode_id, peer, error = await self._take(job, generated, decode_id, pull_from)
            if peer is not None:
                return Handed(decode_id, peer, pipelined=chosen is not None)
            if error is None:  # alive but not accepting: its copy of the KV goes
                error = f"decode worker {decode_id} refused the request"
                self._discard_at(decode_id, key)
        elif chosen is not None and decode_id is not None:  # a pipelined send broke off: the parts there go
            self._discard_at(decode_id, key)
            self.directory.forget(decode_id)  # until the next broadcast says otherwise
        self.endpoint.discard(key)
        return NotHanded(error)

    async def _send(self, job: PrefillJob, decode_id: str) -> str | None:
        """Send the parked KV to ``decode_id`` whole; an error message, or None. A send that fails later is
        reported to that decode worker at once (``KVSender``), so it does not wait out the deadline."""
        buffers = await self._parked_kv(job.key, lambda: job.abort_requested)  # parked with the first token
        if buffers is None:
            return f"prefilled KV of {job.key} was not found on {self.directory.worker_id}"
        self.sender.send(job.key, buffers, decode_id)
        return None

    async def _take(
        self, job: PrefillJob, generated: tuple[int, ...], decode_id: str, pull_from: str | None
    ) -> tuple[str, DecodePeer | None, str | None]:
        """``take`` on ``decode_id``: (the decode worker it ended with, its peer if it took the request, error).
        One that turns out dead before any of the KV lent to it has been read is passed over (waited for as
        ``choose`` does), the request still in this attempt; a KV sent or pipelined there is gone with it."""
        key = job.key
        while True:
            peer = self.directory.peer(decode_id)
            if peer is None:
                return decode_id, None, f"decode worker {decode_id} is unavailable (no handoff link)"
            try:
                taken = await peer.take(Take(job.req, generated, job.subscriber, pull_from))
                return decode_id, peer if taken else None, None
            except Exception as exc:  # the decode worker died between the broadcast and now
                error = f"decode worker {decode_id} is unavailable ({type(exc).__name__})"
                if not actor_died(exc):
                    return decode_id, None, error
            self.directory.died(decode_id)
            if pull_from is None or not self.sender.lent_unread(key):
                return decode_id, None, error
            other = await self.choose(job)  # none serving: waits, the lending's deadline running
            if other is None or job.abort_requested or not self.sender.relend(key, other):
                return decode_id, None, error
            worker_id = self.directory.worker_id
            logger.warning("prefill %s: %s (%s); its KV goes to %s instead", worker_id, error, key, other)
            decode_id = other

    def _discard_at(self, decode_id: str, key: str) -> None:
        peer = self.directory.peer(decode_id)
        if peer is not None:
            peer.send(Discard(key))

    def follow(self, req: Request, peer: DecodePeer, refinement: asyncio.Future[LengthEstimate | None]) -> None:
        """Give the decode worker ``req`` went to the prediction that was late for its handoff, once it is done."""
        task = asyncio.create_task(self._refine(req, peer, refinement))
        self._refining.add(task)  # held until done (the loop keeps only weak references)
        task.add_done_callback(self._refining.discard)

    async def _refine(self, req: Request, peer: DecodePeer, refinement: asyncio.Future[LengthEstimate | None]) -> None:
        estimate = await self.predictions.later(refinement)
        if estimate is not None:
            peer.send(Refine(req.request_id, req.attempt, estimate))
