"""SCLS slice moves on a decode worker (SCLS §4.5, §7): mark, cut, ship the KV, hand the request over.

    ClusterMonitor round ─▶ rebalance(order) ─▶ pick_movers over the engine's snapshot ─▶ mark (engine thread)
    engine: the marked request ends at its next slice boundary (``length``) with its KV parked under its key
    hand_over: send the KV to the destination's endpoint, wait until it has landed, destination.adopt(...)
               ─▶ the request's stream gets a ``moved_to`` marker: the rest comes from the destination
    a destination that refuses, or a send that fails, leaves the request here: it resumes from its parked KV

The worker owns the requests; this module owns only the move protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tetriserve.decode_worker.role import decode_role, snapshot_of
from tetriserve.decode_worker.slices import Order, SliceMoves, pick_movers
from tetriserve.engine.ray_api import AwaitedMethod
from tetriserve.transport.api import Received

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

    from tetriserve.decode_worker.worker import DecodeWorker, Running

logger = logging.getLogger(__name__)


class DecodePeer(Protocol):
    """The actor handle of the decode worker a slice moves to: the calls this module makes on it."""

    @property
    def adopt(self) -> AwaitedMethod[bool]: ...

    @property
    def abort(self) -> AwaitedMethod[bool]: ...

    @property
    def discard(self) -> AwaitedMethod[bool]: ...


@dataclass(frozen=True)
class Move:
    key: str  # its KV is parked under this at the slice boundary
    dst: str
    address: str
    handle: DecodePeer


class SliceMover:
    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker
        self.counts = SliceMoves()
        self._keys = itertools.count()  # each parked slice its own key

    async def rebalance(self, order: Order, address: str, handle: DecodePeer, slice_iters: int) -> list[str]:
        """Mark requests to move to ``order.dst`` at their next boundary (the ClusterMonitor's round)."""
        w = self.worker
        if slice_iters <= 0 or order.src != w.worker_id or order.dst == w.worker_id:
            return []
        snap = snapshot_of(w.engine.snapshot.extra)
        # a request marked before keeps its mark (and key) until it has moved: the engine may already have
        # cut it, with its KV parked under that key, while still listing it as running
        views = [v for v in (snap.running if snap is not None else ()) if self._unmarked(v.request_id)]
        picked = pick_movers(views, order, slice_iters)
        marks: dict[str, str] = {}
        for rid in picked:
            run = w.running[rid]
            run.move = Move(f"move:{rid}:{w.worker_id}:{next(self._keys)}", order.dst, address, handle)
            marks[rid] = run.move.key
        if marks:

            def mark(scheduler: Scheduler) -> None:
                role = decode_role(scheduler)
                for rid, key in marks.items():
                    role.mark_moving(rid, key)

            await w.engine.call(mark)
            logger.info("decode %s: %d request(s) to move to %s at their boundary", w.worker_id, len(marks), order.dst)
        return picked

    def _unmarked(self, rid: str) -> bool:
        run = self.worker.running.get(rid)
        return run is not None and run.move is None

    async def hand_over(self, run: Running, move: Move, resume: Callable[[Running, str | None], None]) -> None:
        """The slice has ended with the KV parked under ``move.key``: continue the request on ``move.dst``, or
        here (``resume``) if it cannot go."""
        w = self.worker
        rid = run.request.request_id
        run.move = None
        buffers = await w.parked_kv(move.key)
        if buffers is None:
            logger.error("decode %s: parked KV %s not found; %s recomputes it", w.worker_id, move.key, rid)
        handed = False
        if buffers is not None and await self._sent(move, buffers):
            try:
                handed = await move.handle.adopt.remote(run.request, tuple(run.generated), move.key, run.subscriber)
            except asyncio.CancelledError:  # aborted meanwhile: it may have been taken over there
                move.handle.abort.remote(rid)
                move.handle.discard.remote(move.key)
                raise
            except Exception:
                logger.exception("decode %s: %s could not take %s", w.worker_id, move.dst, rid)
            if not handed:
                with contextlib.suppress(Exception):  # best effort: the KV expires there anyway
                    move.handle.discard.remote(move.key)
        if handed:
            self.counts.moved_out += 1
            w.moved_away(run, move.dst, move.handle)
            return
        self.counts.kept += 1  # it goes on here, from its parked KV (recomputed if that was lost)
        if buffers is not None:
            w.endpoint.hold(move.key, buffers)
        resume(run, move.key if buffers is not None else None)

    async def _sent(self, move: Move, buffers: list[Received]) -> bool:
        """Send the parked KV to the destination and wait until it has landed there (False: it failed)."""
        from tetriserve.transport.api import TransferState

        w = self.worker
        handle = w.endpoint.send(move.address, move.key, buffers, w.config.transport.timeout_s)
        while handle.state is TransferState.PENDING:
            await asyncio.sleep(0.001)
        if handle.state is TransferState.FAILED:
            logger.error("decode %s: sending %s to %s failed: %s", w.worker_id, move.key, move.dst, handle.error)
            return False
        return True
