"""The pipelined handoff (TetriInfer §3.3.4 moves the KV after the prefill; here the two overlap).

    the prompt enters the engine; its prediction, once done (if before the prefill is) ─▶ the dispatcher
              chooses the decode worker
              prefill chunk 0 ─▶ part 0 parked ───────────▶ sent to it at once
              prefill chunk 1 ─▶ part 1 parked ───────────▶ sent as soon as parked
              last chunk, first token ─▶ last part ───────▶ sent; then decode.take(prompt + first token)

    (on one host, with ``transport.pull``: the chosen decode worker is asked to pull the key instead, and maps
    each part from this worker's slabs as it is published)

The dispatcher needs the length prediction (TetriInfer's parallel mode computes
it while the prompt prefills), so the decode worker can be chosen before the
prefill ends when the prediction is ready first: long prompts, a predictor
with nothing queued. Under load the prediction is late for nearly every prompt:
at 2 requests a second and at saturation, 36 or 37 of 200 handoffs are
pipelined, nearly all of them the 36 prompts longer than one chunk, which do
not wait for it (below), in
``python benchmarks/diagnostics/pipelined_share.py --num-prompts 200 --request-rate 2 --seed 0 --rounds 2``.
So where the prediction cannot change the
choice — one accepting decode worker to choose from — a prompt longer than one
chunk (whose KV always leaves in several parts) does not wait for it: the
decode worker is chosen at once on the predictor's instant estimate. The
handoff then treats the prediction as for any late one: it waits for it up to
``prefill.predictor_wait_ms``, and one the predictor has begun follows the
request to the decode worker. The choice waits
for the prompt to enter the engine, so that it is made on loads no older than
the prefill (not the queue wait before it). Then the KV of the chunks computed so far
leaves at once and each later part as soon as the packer parks it, so at the
first token only the last part is still to travel. When the prefill ends
first, nothing has been sent and the handoff is the unpipelined one
(prediction or its instant fallback, then one send of the whole KV). Off with
``transport.pipeline: false``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from tetriserve.channel.handoff import Discard
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.kv_sends import KVSender
from tetriserve.prefill_worker.lifecycle import PrefillJob
from tetriserve.prefill_worker.policy import PrefillPolicySpec, chunk_tokens
from tetriserve.prefill_worker.predictions import Ticket


def leaves_in_parts(spec: PrefillPolicySpec, cost: CostEstimator | None, prompt_len: int) -> bool:
    """Whether a prompt of ``prompt_len`` tokens is computed, so its KV parked and sent, in several parts."""
    return spec.chunking != "none" and prompt_len > chunk_tokens(spec, cost)


class EarlyHandoff:
    """One request's chance at a pipelined handoff, started when its prompt enters the engine.

    ``several_parts``: its KV leaves in several parts (it is longer than one chunk); ``instant``: the predictor's
    instant estimate, taken when the choice does not wait for the prediction."""

    def __init__(
        self,
        job: PrefillJob,
        ticket: Ticket,
        directory: DecodeDirectory,
        sender: KVSender,
        instant: Callable[[PredictInput], LengthEstimate],
        several_parts: bool,
    ) -> None:
        self._job, self._ticket, self._directory, self._sender = job, ticket, directory, sender
        self._instant, self._several_parts = instant, several_parts
        self.decode_id: str | None = None  # chosen before the prefill ended
        self.on_instant = False  # chosen on the predictor's instant estimate, the prediction still pending
        self._prefilled = asyncio.Event()  # the first token is out: the last part is due any moment
        self._dropped = False
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> str | None:
        future, key = self._ticket.future, self._job.key
        estimate: LengthEstimate | None
        if not future.done() and self._several_parts and self._directory.accepting() == 1:
            estimate = self._instant(self._ticket.item)  # one decode worker to choose from: the choice is made
            self.on_instant = True
        else:
            await asyncio.wait([future])
            if future.cancelled() or (estimate := future.result()) is None:
                return None
        decode_id = self._directory.pick(replace(self._job.view, estimate=estimate))
        if decode_id is None:
            return None
        self.decode_id = decode_id
        if self._sender.pull(decode_id, key):  # it takes each part as the packer publishes it
            return None
        return await self._sender.forward_parts(
            key, decode_id, give_up=lambda: self._job.abort_requested, hurry=self._prefilled
        )

    async def outcome(self) -> tuple[str, str | None] | None:
        """Once the prefill is done: (decode worker, error forwarding the KV or None) if one was chosen before
        it ended, its KV forwarded to the last part; else None, and nothing was sent."""
        self._prefilled.set()
        if self.decode_id is None:
            self._task.cancel()
            return None
        return self.decode_id, await self._task

    def drop(self) -> None:
        """The request goes no further: stop forwarding, and the chosen decode worker drops what it got."""
        self._task.cancel()
        if self.decode_id is not None and not self._dropped:
            self._dropped = True
            peer = self._directory.peer(self.decode_id)
            if peer is not None:
                peer.send(Discard(self._job.key))
