"""The prefill worker's KV sender (TetriInfer §3.3.4: the KV cache moves from the prefill to the chosen decode
instance): sends a request's parked KV whole, or part by part while its later chunks compute (a pipelined
handoff, ``pipeline.py``), or lends it to a decode worker on this host that pulls it from this worker's slabs
(``transport/shm_pull.py``).

Every send or lending in flight is polled, never waited on; a failed one is reported to its receiver at once
(``KvFailed``: it frees its blocks and recomputes or fails the load) instead of letting the decode worker wait
out the transfer's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from tetriserve.channel.handoff import KvFailed, PullKV
from tetriserve.observability import tracing
from tetriserve.prefill_worker import spans
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.transport import parts
from tetriserve.transport.api import Buffer, Received, TransferHandle, TransferState, Transport

logger = logging.getLogger(__name__)

POLL_S = 0.05
PART_POLL_S = 0.005  # a pipelined handoff's look for the next part while the prefill still runs


class KVSender:
    def __init__(self, worker_id: str, endpoint: Transport, directory: DecodeDirectory, timeout_s: float) -> None:
        self.worker_id, self.endpoint, self.directory, self.timeout_s = worker_id, endpoint, directory, timeout_s
        self._sends: dict[str, tuple[TransferHandle, str]] = {}  # KV key -> (its send's handle, the decode worker)
        self._spans: dict[str, tracing.Span] = {}  # KV key -> its send's span (tracing on only)
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_sends())

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    @property
    def in_flight(self) -> int:
        return len(self._sends)

    def receiver(self, key: str) -> str | None:
        """The decode worker ``key``'s send in flight goes to."""
        held = self._sends.get(key)
        return held[1] if held is not None else None

    def track(self, key: str, handle: TransferHandle, decode_id: str) -> None:
        """Watch a KV send (``key``: a request's, or one part of it) to ``decode_id`` until it completes."""
        self._sends[key] = (handle, decode_id)
        address = self.directory.address(decode_id)
        spans.sending(self._spans, key, tracing.now_ns(), handle.nbytes, address, decode_id)

    def send(self, key: str, buffers: Sequence[Buffer], decode_id: str) -> None:
        """Send ``key``'s KV (parked with its first token) to ``decode_id`` in one piece."""
        self.track(key, self.endpoint.send(self.directory.address(decode_id), key, buffers, self.timeout_s), decode_id)

    def lend(self, key: str, decode_id: str) -> bool:
        """Whether ``decode_id`` can pull ``key`` from here (an shm endpoint of this host); if so, the lending is
        watched like a send (its span, and a failure told to the decode worker)."""
        if not self.endpoint.lends_to(self.directory.address(decode_id)):
            return False
        self.track(key, self.endpoint.lending(key, self.timeout_s), decode_id)
        return True

    def pull(self, decode_id: str, key: str) -> bool:
        """Have ``decode_id`` pull ``key``'s KV now, each part as it is published, where it can; False: it must be
        sent."""
        peer = self.directory.peer(decode_id)
        if peer is None or not self.lend(key, decode_id):
            return False
        peer.send(PullKV(self.endpoint.address, key))
        return True

    def lent_unread(self, key: str) -> bool:
        """Whether ``key``'s KV is lent, none of it read yet (so another reader may still take it)."""
        held = self._sends.get(key)
        return held is not None and not held[0].nbytes

    def relend(self, key: str, decode_id: str) -> bool:
        """Give the lending of ``key`` still in flight to ``decode_id`` instead (its first reader turned out dead);
        False where it cannot be: not lent, over (its deadline passed), or ``decode_id`` cannot pull from here."""
        held = self._sends.get(key)
        if held is None or held[0].state is not TransferState.PENDING:
            return False
        if not self.endpoint.lends_to(self.directory.address(decode_id)):
            return False
        self._sends[key] = (held[0], decode_id)  # a failed pull is told to the one pulling now
        return True

    async def forward_parts(
        self, key: str, decode_id: str, give_up: Callable[[], bool], hurry: asyncio.Event
    ) -> str | None:
        """Send ``key``'s KV to ``decode_id`` part by part as the engine's packer parks them (``transport/parts.py``),
        up to and including the last part: the parts of the chunks computed so far at once, each later one as soon
        as it is parked. Returns an error message, or None once the last part is on its way. It looks for the next
        part every ``PART_POLL_S`` while the prefill runs (a chunk takes longer than that) and every millisecond
        once ``hurry`` is set (the first token is out: the last part is being packed)."""
        address = self.directory.address(decode_id)
        deadline = time.monotonic() + self.timeout_s
        index = 0
        while True:
            found = self._take_part(key, index)
            if found is not None:
                part, buffers = found
                self.track(part, self.endpoint.send(address, part, buffers, self.timeout_s), decode_id)
                if parts.is_last(part):
                    return None
                index += 1
                continue
            if give_up():
                return f"request of {key} was aborted"
            if (why := self.endpoint.failed(key)) is not None:
                return why
            if time.monotonic() >= deadline:
                return f"prefilled KV of {key} was not parked within {self.timeout_s:.0f} s"
            if hurry.is_set():
                await asyncio.sleep(0.001)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), PART_POLL_S)

    def _take_part(self, key: str, index: int) -> tuple[str, list[Received]] | None:
        """Part ``index`` of ``key`` (its key and buffers), last or not, if the packer has parked it."""
        for last in (False, True):
            part = parts.part_key(key, index, last)
            if (buffers := self.endpoint.recv(part)) is not None:
                return part, buffers
        return None

    async def _watch_sends(self) -> None:
        """Forever: end each finished send and its span; tell the decode worker of each failed one."""
        while True:
            await asyncio.sleep(POLL_S)
            for key, (handle, decode_id) in list(self._sends.items()):
                if handle.state is TransferState.PENDING:
                    continue
                del self._sends[key]
                span = self._spans.pop(key, tracing.INVALID_SPAN)  # a pull's bytes are known once it is over
                tracing.end(span, {"tetriserve.kv.bytes": handle.nbytes}, error=handle.error)
                if handle.state is TransferState.FAILED:
                    logger.warning("prefill %s: KV send of %s failed: %s", self.worker_id, key, handle.error)
                    peer = self.directory.peer(decode_id)
                    if peer is not None:
                        peer.send(KvFailed(key, handle.error or "send failed"))
