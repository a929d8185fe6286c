"""A front door's streams from every worker, and how it tells that a request's attempt is lost.

One channel endpoint per front-door process (``channel/core.py``) takes every worker's chunks for
this process's requests and routes them to their queues; per worker, the Ray
``subscribe`` call that attached it carries the worker's ``Heartbeat`` (its
incarnation, the (request, attempt) pairs it holds for this process) and fails
when the worker is gone (``channel/streams.py``). ``tend`` runs every ``TEND_S``::

    stream ended / failed / silent for BEAT_TIMEOUT_S ─▶ every request on that worker: Lost
    worker handle replaced (the supervisor re-created it) ─▶ reopen
    request without a token or a heartbeat listing it for idle_timeout_s ─▶ Lost

With each subscription the worker is also asked to attach to this process's intake (``attach_intake``,
``channel/intake.py``) under a routing id drawn for it: submits and aborts then go to it over the same endpoint
while the subscription lasts. ``send`` says False when the worker is not attached (not yet, or not any more), and
the caller makes the Ray call instead.

Chunks of a worker's previous life are dropped; a ``moved_to`` naming a worker
whose stream is down loses the request at once. ``RayBackend.generate`` turns a
``Lost`` into a re-placement or a migration.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tetriserve.channel import core
from tetriserve.channel.intake import IntakeMessage
from tetriserve.channel.streams import HEARTBEAT_S, STREAM_MESSAGES, Chunks
from tetriserve.common.errors import actor_died
from tetriserve.common.stream import Heartbeat, StreamChunk
from tetriserve.control_plane.handles import WorkerHandle
from tetriserve.frontdoor.token_log import TokenLog

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)

TEND_S = 0.5  # how often streams are checked: reopened, timed out, requests' deadlines
BEAT_TIMEOUT_S = 3 * HEARTBEAT_S + 4  # a control stream silent this long is taken as broken


@dataclass(frozen=True)
class Lost:
    """A request's attempt is lost: the worker it was on is gone, or it fell silent."""

    attempt: int
    worker: str
    reason: str
    cause: str = "worker_lost"  # the metrics' migration reason: worker_lost, idle_timeout, worker_unavailable, ...


@dataclass
class OpenRequest:
    """A request this process is streaming: its token log and its chunks' queue."""

    log: TokenLog
    queue: asyncio.Queue[StreamChunk | Lost] = field(default_factory=asyncio.Queue)
    seen: float = field(default_factory=time.monotonic)  # last sign of life: a chunk, a heartbeat listing it
    over_ray: bool = False  # its attempt's submit went over Ray (its prefill worker had no intake attached)

    def lose(self, worker: str, reason: str, cause: str = "worker_lost") -> None:
        if not self.log.done:
            self.queue.put_nowait(Lost(self.log.attempt, worker, reason, cause))


class WorkerStreams:
    """This process's streams from every worker: one channel endpoint that every worker sends this process's
    chunks to (routed to the requests' queues), and per worker the Ray ``subscribe`` call that attached it, which
    carries heartbeats and fails when the worker is gone (``channel/streams.py``)."""

    def __init__(
        self,
        workers: Callable[[], Mapping[str, WorkerHandle]],
        host: str,
        idle_timeout_s: float,
        died: Callable[[str, int], None] | None = None,
    ) -> None:
        """``died(worker, incarnation)``: Ray says that life of the worker is dead (its stream failed with
        ``ActorDiedError``), the first anyone hears of it."""
        self.id = f"frontdoor-{uuid.uuid4().hex[:12]}"
        self.loop = asyncio.get_running_loop()
        self.requests: dict[str, OpenRequest] = {}
        self.down: set[str] = set()  # workers whose stream failed and has not beaten since
        self._workers = workers
        self._died = died
        self._idle_timeout_s = idle_timeout_s
        self._endpoint = core.Endpoint(host, f"streams of {self.id}", accepts=STREAM_MESSAGES)
        self.address = self._endpoint.address
        self._routes: dict[str, bytes] = {}  # worker -> the routing id its current subscription attaches under
        self._settling: set[asyncio.Task[None]] = set()
        self._unattached: set[str] = set()  # workers whose attach came before their subscription: ask again
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._refs: dict[str, AsyncIterable[ObjectRef[Heartbeat]]] = {}
        self._handles: dict[str, WorkerHandle] = {}  # the handle each stream was opened with
        self._opened: dict[str, float] = {}
        self._beats: dict[str, float] = {}
        self._incarnations: dict[str, int] = {}
        for worker_id in workers():
            self.open(worker_id)
        self._reader = self.loop.create_task(self._endpoint.serve(self._route))
        self._tender = self.loop.create_task(self._tend())

    def open(self, worker_id: str) -> None:
        """Open the stream from ``worker_id``'s current handle unless it is open."""
        task = self._tasks.get(worker_id)
        handle = self._workers().get(worker_id)
        if handle is None or (task is not None and not task.done() and self._handles.get(worker_id) is handle):
            return
        if task is not None:
            task.cancel()
        before = self._handles.get(worker_id)
        if before is not None and before is not handle:  # a new life: its predecessor's failure is not its own, and
            self.down.discard(worker_id)  # a request handed to it before its first heartbeat is not lost
        ref = handle.subscribe.remote(self.id, self.address)
        self._routes[worker_id] = f"{worker_id}/{secrets.token_hex(8)}".encode()
        self._attach(worker_id, handle)
        self._refs[worker_id], self._handles[worker_id] = ref, handle
        self._opened[worker_id] = self._beats[worker_id] = time.monotonic()
        self._tasks[worker_id] = self.loop.create_task(self._watch(worker_id, ref))

    def _attach(self, worker_id: str, handle: WorkerHandle) -> None:
        """Ask the worker to attach to this process's intake under its current route (``attach_intake``)."""
        route = self._routes[worker_id]
        self._unattached.discard(worker_id)
        call = handle.attach_intake.remote(self.id, self.address, route)
        settling = self.loop.create_task(self._settle(call, worker_id, route))
        self._settling.add(settling)
        settling.add_done_callback(self._settling.discard)

    async def _settle(self, call: Awaitable[bool], worker_id: str, route: bytes) -> None:
        """Wait for the attach call; a worker that did not have the subscription yet is asked again by ``tend``."""
        try:
            attached = await call
        except Exception as exc:  # the worker is gone: its stream's loss says so
            logger.debug("attaching the intake of %s failed: %s", worker_id, type(exc).__name__)
            return
        if not attached and self._routes.get(worker_id) == route:
            self._unattached.add(worker_id)

    def send(self, worker_id: str, message: IntakeMessage) -> bool:
        """Send ``message`` to ``worker_id`` over the intake; False when its subscription has not attached it."""
        route = self._routes.get(worker_id)
        return route is not None and worker_id not in self.down and self._endpoint.send(route, message)

    def _route(self, batch: Chunks) -> None:
        now = time.monotonic()
        for chunk in batch.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None or chunk.incarnation < self._incarnations.get(chunk.worker, 0):
                continue  # not ours any more, or a previous life's last words
            req.queue.put_nowait(chunk)
            if chunk.attempt == req.log.attempt:
                req.seen = now
                if chunk.moved_to in self.down:
                    req.lose(chunk.moved_to, f"{chunk.moved_to} is down")

    async def _watch(self, worker_id: str, stream: AsyncIterable[Awaitable[Heartbeat]]) -> None:
        try:
            async for ref in stream:
                self._beat(await ref)
            reason = "its stream ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = type(exc).__name__
            if self._died is not None and actor_died(exc) and worker_id not in self.down:
                self._died(worker_id, self._incarnations.get(worker_id, 0))
        log = logger.debug if worker_id in self.down else logger.warning  # a dead worker's retries: once is enough
        log("stream %s from %s lost: %s", self.id, worker_id, reason)
        self._lost(worker_id, reason)

    def _beat(self, beat: Heartbeat) -> None:
        now = time.monotonic()
        self._beats[beat.worker] = now
        self.down.discard(beat.worker)
        self._incarnations[beat.worker] = max(beat.incarnation, self._incarnations.get(beat.worker, 0))
        for rid, attempt in beat.holding:
            req = self.requests.get(rid)
            if req is not None and req.log.attempt == attempt:
                req.seen = now

    def _lost(self, worker_id: str, reason: str) -> None:
        """The stream from ``worker_id`` is gone: every request on it is lost."""
        self.down.add(worker_id)
        for req in self.requests.values():
            if req.log.worker == worker_id:
                req.lose(worker_id, f"lost the stream from {worker_id} ({reason})")

    async def _tend(self) -> None:
        while True:
            await asyncio.sleep(TEND_S)
            try:
                self.tend(time.monotonic())
            except Exception:
                logger.exception("stream %s: tending failed", self.id)

    def tend(self, now: float) -> None:
        """Reopen streams that ended or whose worker was re-created; time out silent streams and requests."""
        for worker_id, handle in self._workers().items():
            task = self._tasks.get(worker_id)
            if task is not None and not task.done() and now - self._beats.get(worker_id, now) > BEAT_TIMEOUT_S:
                task.cancel()
                self._lost(worker_id, f"no heartbeat for {BEAT_TIMEOUT_S:.0f} s")
            replaced = self._handles.get(worker_id) is not handle
            if task is None or replaced or (task.done() and now - self._opened.get(worker_id, 0.0) >= 1.0):
                self.open(worker_id)
            elif worker_id in self._unattached and not task.done():
                self._attach(worker_id, handle)
        for req in self.requests.values():
            if not req.log.done and now - req.seen > self._idle_timeout_s:
                req.seen = now
                req.lose(req.log.worker, f"no sign of it for {self._idle_timeout_s:.0f} s", "idle_timeout")

    def close(self) -> None:
        import ray

        self._reader.cancel()
        self._tender.cancel()
        for worker_id, task in self._tasks.items():
            task.cancel()
            try:
                ray.cancel(self._refs[worker_id])
            except Exception:
                logger.debug("cancel of stream %s from %s failed", self.id, worker_id, exc_info=True)
        self._endpoint.close()


def stream_host(config: object) -> str:
    """The address workers reach this process at: the front doors' host, or this node's address when that is a
    wildcard."""
    host = getattr(config, "host", None) or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        import ray

        node_ip: Callable[[], str] = ray.util.get_node_ip_address  # declared as called: Ray leaves it unannotated
        return str(node_ip())
    return str(host)
