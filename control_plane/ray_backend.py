"""``ServingBackend`` over a launched Ray cluster: what the front doors call (DESIGN.md §5b).

    generate(request):
        GlobalScheduler.place(PlacementRequest) ─▶ Placement(prefill worker)      a decision, not a relay
        prefill.submit(request, subscriber)
        chunks ◀══ this process's one stream from each worker (ZeroMQ; ``subscribe``) ══ prefill, then decode
               ─▶ the request's ``TokenLog``: in order, no duplicate, stale attempts dropped ─▶ caller
        lost  ─▶ migrate: next attempt, placed again with the tokens the caller already has (``resume``)
        finish ─▶ GlobalScheduler.record(finish event)

Streams are opened per worker, not per request, and stay open: a worker's
message carries every chunk of this process's requests that was ready, so the
message rate follows the engine's steps. Chunks arrive on one ZeroMQ socket of
this process; the Ray ``subscribe`` call to each worker attaches it and
carries the worker's ``Heartbeat`` (its incarnation, the requests it holds for
this process). They are bound to the event loop they were opened in and
reopened if that loop changes, if the worker's handle changes (the supervisor
re-created it), or if the stream fails. An abort goes to the worker the
request is on now (the log knows, from ``moved_to`` markers); a worker it has
left forwards it.

No request is lost to a worker's death (the log of delivered tokens is the
truth, as in Dynamo's frontend migration). A request's attempt is *lost* when
the stream from the worker it is on fails or goes silent, when a ``moved_to``
names a worker whose stream is down, when a worker ends it with a ``retry``
error, or when neither a token nor a heartbeat listing it has come for
``stream_idle_timeout_s``. Then, up to ``migration_limit`` times, the request
is placed again as its next attempt: before its first token that is a plain
re-placement; after, the new prefill worker prefills prompt + delivered tokens
and the stream goes on from there (greedy output is identical; a seeded
sampler is not reproducible across a move). Chunks of the old attempt are
dropped, and the old attempt is aborted on every worker. When nothing can
take it, or no prefill worker serves within ``placement_timeout_s``, the stream
ends with an ``error`` chunk marked ``retry`` (the gateways answer 503 /
``UNAVAILABLE``).

``status`` asks every worker actor for its policies in parallel, each with a
deadline, so a stuck worker shows an empty policy instead of hanging the call;
``set_policy`` checks the change (``policy_admin``) before any actor sees it and
calls the targeted workers' ``set_policy`` (prefill or decode, by the target's role).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tetriserve.common.outbox import HEARTBEAT_S
from tetriserve.common.request import Request
from tetriserve.common.stream import (
    FinishReason,
    Heartbeat,
    Placement,
    PlacementRequest,
    StateEvent,
    StreamChunk,
    decode_chunks,
)
from tetriserve.control_plane.backend import ClusterStatus, WorkerPolicy, WorkerStatus
from tetriserve.control_plane.launcher import Cluster
from tetriserve.control_plane.policy_admin import Setter, apply_changes, parse_changes, resolve_targets
from tetriserve.control_plane.token_log import AT_ONCE, TokenLog

logger = logging.getLogger(__name__)

POLICIES_TIMEOUT_S = 2.0  # status: a worker that does not answer by then shows no policy
SET_POLICY_TIMEOUT_S = 30.0
TEND_S = 0.5  # how often streams are checked: reopened, timed out, requests' deadlines
BEAT_TIMEOUT_S = 3 * HEARTBEAT_S + 4  # a control stream silent this long is taken as broken
PLACE_TIMEOUT_S = 5.0  # one ``place`` call (the GlobalScheduler may be restarting)


@dataclass(frozen=True)
class Lost:
    """A request's attempt is lost: the worker it was on is gone, or it fell silent."""

    attempt: int
    worker: str
    reason: str


@dataclass
class _Open:
    """A request this process is streaming: its chunks' queue and, once placed, its token log."""

    queue: asyncio.Queue[StreamChunk | Lost] = field(default_factory=asyncio.Queue)
    log: TokenLog | None = None
    seen: float = field(default_factory=time.monotonic)  # last sign of life: a chunk, a heartbeat listing it

    def lose(self, worker: str, reason: str) -> None:
        if self.log is not None and not self.log.done:
            self.queue.put_nowait(Lost(self.log.attempt, worker, reason))


class _Streams:
    """This process's streams from every worker: one ZeroMQ PULL socket that every worker pushes this process's
    chunks to (routed to the requests' queues), and per worker the Ray ``subscribe`` call that attached it, which
    carries heartbeats and fails when the worker is gone (``common/outbox.py``)."""

    def __init__(self, workers: Callable[[], dict[str, Any]], host: str, idle_timeout_s: float) -> None:
        import zmq
        import zmq.asyncio

        self.id = f"frontdoor-{uuid.uuid4().hex[:12]}"
        self.loop = asyncio.get_running_loop()
        self.requests: dict[str, _Open] = {}
        self.down: set[str] = set()  # workers whose stream failed and has not beaten since
        self._workers = workers
        self._idle_timeout_s = idle_timeout_s
        self._socket = zmq.asyncio.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._refs: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}  # the handle each stream was opened with
        self._opened: dict[str, float] = {}
        self._beats: dict[str, float] = {}
        self._incarnations: dict[str, int] = {}
        for worker_id in workers():
            self.open(worker_id)
        self._reader = self.loop.create_task(self._read())
        self._tender = self.loop.create_task(self._tend())

    def open(self, worker_id: str) -> None:
        """Open the stream from ``worker_id``'s current handle unless it is open."""
        task = self._tasks.get(worker_id)
        handle = self._workers().get(worker_id)
        if handle is None or (task is not None and not task.done() and self._handles.get(worker_id) is handle):
            return
        if task is not None:
            task.cancel()
        ref = handle.subscribe.remote(self.id, self.address)
        self._refs[worker_id], self._handles[worker_id] = ref, handle
        self._opened[worker_id] = self._beats[worker_id] = time.monotonic()
        self._tasks[worker_id] = self.loop.create_task(self._watch(worker_id, ref))

    async def _read(self) -> None:
        while True:
            try:
                data = await self._socket.recv()
                chunks = decode_chunks(data)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad message (or a socket hiccup) must not end every stream of this process
                logger.exception("stream %s: a message was dropped", self.id)
                await asyncio.sleep(0.01)
                continue
            now = time.monotonic()
            for chunk in chunks:
                req = self.requests.get(chunk.request_id)
                if req is None or chunk.incarnation < self._incarnations.get(chunk.worker, 0):
                    continue  # not ours any more, or a previous life's last words
                req.queue.put_nowait(chunk)
                if req.log is not None and chunk.attempt == req.log.attempt:
                    req.seen = now
                    if chunk.moved_to in self.down:
                        req.lose(chunk.moved_to, f"{chunk.moved_to} is down")

    async def _watch(self, worker_id: str, stream: Any) -> None:
        try:
            async for ref in stream:
                self._beat(await ref)
            reason = "its stream ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = type(exc).__name__
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
            if req is not None and req.log is not None and req.log.attempt == attempt:
                req.seen = now

    def _lost(self, worker_id: str, reason: str) -> None:
        """The stream from ``worker_id`` is gone: every request on it is lost."""
        self.down.add(worker_id)
        for req in self.requests.values():
            if req.log is not None and req.log.worker == worker_id:
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
        for req in self.requests.values():
            if req.log is not None and not req.log.done and now - req.seen > self._idle_timeout_s:
                req.seen = now
                req.lose(req.log.worker, f"no sign of it for {self._idle_timeout_s:.0f} s")

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
        self._socket.close()


def _stream_host(config: Any) -> str:
    """The address workers reach this process at: the front doors' host, or this node's address when that is a
    wildcard."""
    host = getattr(config, "host", None) or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        import ray

        return str(ray.util.get_node_ip_address())
    return str(host)


class RayBackend:
    def __init__(self, cluster: Cluster, model_name: str) -> None:
        self.cluster = cluster
        self._model_name = model_name
        self._streams: _Streams | None = None
        config = getattr(cluster, "config", None)
        self.migration_limit = int(getattr(config, "migration_limit", 3))
        self.idle_timeout_s = float(getattr(config, "stream_idle_timeout_s", 15.0))
        self.placement_timeout_s = float(getattr(config, "placement_timeout_s", 60.0))

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_path(self) -> str:
        return self.cluster.model_path

    @property
    def max_model_len(self) -> int:
        return self.cluster.config.engine.max_model_len

    def _workers(self) -> dict[str, Any]:
        """Every worker's current handle (the supervisor replaces one it re-creates)."""
        return {**self.cluster.prefill, **self.cluster.decode}

    def streams(self) -> _Streams:
        """This event loop's streams from every worker (opened on first use, reopened if one ended)."""
        loop = asyncio.get_running_loop()
        if self._streams is None or self._streams.loop is not loop:
            self._streams = _Streams(self._workers, _stream_host(self.cluster.config), self.idle_timeout_s)
        return self._streams

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        streams = self.streams()
        rid = request.request_id
        req = streams.requests[rid] = _Open()
        log = req.log = TokenLog(rid, "", request.attempt)
        avoid: tuple[str, ...] = ()
        try:
            for moves in range(self.migration_limit + 1):
                attempt = request if moves == 0 else replace(request, attempt=log.attempt + 1, resume=tuple(log.tokens))
                placement = await self._place(attempt, avoid)
                if placement.prefill_worker is None:
                    error, retry = placement.error, placement.retry
                    yield StreamChunk(rid, (), FinishReason.ERROR, error, index=AT_ONCE, retry=retry)
                    return
                worker = placement.prefill_worker
                log.restart(attempt.attempt, worker)
                req.seen = time.monotonic()
                submitted = self._workers()[worker].submit.remote(attempt, streams.id)
                watch = asyncio.ensure_future(_report_failure(submitted, req, worker))
                try:
                    lost = None
                    while not log.done and lost is None:
                        item = await req.queue.get()
                        if isinstance(item, Lost):
                            lost = item if item.attempt == log.attempt else None
                        elif item.retry and item.finished and item.attempt == log.attempt:
                            lost = Lost(item.attempt, item.worker, item.error or "a worker gave up on it")
                        else:
                            for chunk in log.add(item):
                                yield chunk
                finally:
                    watch.cancel()
                if lost is None:
                    return
                logger.warning(
                    "request %s: attempt %d lost on %s (%s) after %d tokens",
                    rid,
                    lost.attempt,
                    lost.worker,
                    lost.reason,
                    len(log.tokens),
                )
                self._abort_everywhere(rid, lost.attempt)
                avoid = (lost.worker,)
            error = f"service unavailable: the request was lost {self.migration_limit + 1} times ({lost.reason})"
            yield StreamChunk(rid, (), FinishReason.ERROR, error, index=AT_ONCE, retry=True)
        finally:
            streams.requests.pop(rid, None)
            if log.worker:
                self._finished(request, log)

    async def _place(self, request: Request, avoid: tuple[str, ...]) -> Placement:
        """Ask the GlobalScheduler where ``request`` goes; while none serves (or the scheduler itself is being
        re-created), ask again until ``placement_timeout_s``."""
        rid = request.request_id
        meta = PlacementRequest(
            rid,
            len(request.prompt_token_ids),
            request.sampling.max_tokens,
            request.arrival_time,
            request.attempt,
            avoid,
        )
        deadline = time.monotonic() + self.placement_timeout_s
        why = "no prefill worker is serving"
        while True:
            try:
                placement: Placement = await asyncio.wait_for(
                    self.cluster.scheduler.place.remote(meta), PLACE_TIMEOUT_S
                )
                if placement.prefill_worker is not None and placement.prefill_worker in self._workers():
                    return placement
                if not placement.retry:
                    return placement
                why = placement.error or why
            except Exception as exc:  # the GlobalScheduler is down or restarting
                why = f"the global scheduler is unavailable ({type(exc).__name__})"
            if time.monotonic() >= deadline:
                return Placement(rid, None, f"service unavailable: {why}", retry=True)
            await asyncio.sleep(0.2)

    def _abort_everywhere(self, request_id: str, attempt: int) -> None:
        """Abort a lost attempt on every worker that may still hold it (it may have reached a decode worker)."""
        for handle in self._workers().values():
            _forget(handle.abort.remote(request_id, attempt))

    def _finished(self, request: Request, log: TokenLog) -> None:
        """Tell the table how the request ended; abort it where it is if the caller left before the end."""
        finish = log.finish
        reason = finish.finish_reason if finish is not None and finish.finish_reason else FinishReason.ABORT
        if finish is None or finish.worker != log.worker:  # the caller gave up, or the end did not come from there
            handle = self._workers().get(log.worker)
            if handle is not None:
                _forget(handle.abort.remote(request.request_id, log.attempt))
        event = StateEvent(
            request.request_id,
            reason.state,
            time.time(),
            "frontdoor",
            reason.value,
            len(log.tokens),
            attempt=log.attempt,
        )
        _forget(self.cluster.scheduler.record.remote([event]))

    def close(self) -> None:
        """Drop the streams (call from the loop that used the backend)."""
        if self._streams is not None:
            self._streams.close()
            self._streams = None

    async def abort(self, request_id: str, reason: str = "abort") -> bool:
        req = self._streams.requests.get(request_id) if self._streams is not None else None
        if req is None:
            return False
        attempt = req.log.attempt if req.log is not None else 0
        chunk = StreamChunk(request_id, (), FinishReason(reason), worker="frontdoor", index=AT_ONCE, attempt=attempt)
        req.queue.put_nowait(chunk)
        return True

    async def healthy(self) -> bool:
        """Serving: the GlobalScheduler answers and at least one prefill and one decode worker serve."""
        try:
            await asyncio.wait_for(self.cluster.scheduler.status.remote(), timeout=5)
            members = await asyncio.wait_for(self.cluster.monitor.snapshot.remote(), timeout=5)
        except Exception:
            return False
        serving = {m["role"] for m in members if m["state"] == "serving"}
        return serving >= {"prefill", "decode"}

    async def status(self) -> ClusterStatus:
        members, sched, policies = await asyncio.gather(
            self.cluster.monitor.snapshot.remote(), self.cluster.scheduler.status.remote(), self._policies()
        )
        supervision = getattr(self.cluster, "supervision", None)
        slots = {slot.name: slot for slot in supervision.view()} if supervision is not None else {}
        workers = []
        for m in members:
            slot = slots.get(m["worker_id"])
            state = slot.state.value if slot is not None else m["state"]
            workers.append(
                WorkerStatus(
                    m["worker_id"],
                    m["role"],
                    state,
                    m["load"],
                    policies.get(m["worker_id"], {}),
                    incarnation=slot.incarnation if slot is not None else int(m.get("incarnation", 0)),
                    restarts=slot.restarts if slot is not None else 0,
                    health=m["state"],
                )
            )
        return ClusterStatus(self._model_name, tuple(workers), int(sched["in_flight"]), self.cluster.dashboard_url)

    async def _policies(self) -> dict[str, dict[str, str]]:
        """Every worker's ``policies()``, asked in parallel; ``{}`` for one that fails or is late."""
        handles = self._workers()

        async def one(worker_id: str, handle: Any) -> dict[str, str]:
            try:
                return dict(await asyncio.wait_for(handle.policies.remote(), POLICIES_TIMEOUT_S))
            except Exception as exc:
                logger.warning("status: no policies from %s (%s: %s)", worker_id, type(exc).__name__, exc)
                return {}

        answers = await asyncio.gather(*(one(wid, h) for wid, h in handles.items()))
        return dict(zip(handles, answers, strict=True))

    async def set_policy(self, worker_id: str | None, changes: dict[str, str]) -> list[WorkerPolicy]:
        role, targets = resolve_targets(worker_id, self.cluster.prefill, self.cluster.decode)
        parsed = parse_changes(role, changes)
        return await apply_changes({wid: _actor_setter(h) for wid, h in targets.items()}, parsed, role)


def _actor_setter(handle: Any) -> Setter:
    """``handle.set_policy.remote`` as a coroutine that raises the worker's own ValueError, not Ray's wrapper."""

    async def call(changes: dict[str, Any]) -> dict[str, str]:
        try:
            return dict(await asyncio.wait_for(handle.set_policy.remote(changes), SET_POLICY_TIMEOUT_S))
        except ValueError as exc:  # Ray raises a RayTaskError that is also a ValueError; .cause is the worker's
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, ValueError) else exc) from None

    return call


async def _report_failure(submitted: Any, req: _Open, worker_id: str) -> None:
    """The request's attempt is lost if its prefill worker could not take it (dead, or dying)."""
    try:
        await submitted
    except Exception as exc:
        logger.warning("request: %s could not take it: %s", worker_id, type(exc).__name__)
        req.lose(worker_id, f"prefill worker {worker_id} is unavailable ({type(exc).__name__})")


_FORGOTTEN: set[asyncio.Task[None]] = set()  # fire-and-forget calls still in flight (tasks need a reference)


def _forget(ref: Any) -> None:
    """Fire and forget an actor call; its failure (the actor is gone) is logged at debug level, not raised."""

    async def wait() -> None:
        try:
            await ref
        except Exception as exc:
            logger.debug("actor call failed: %s", type(exc).__name__)

    try:
        task = asyncio.get_running_loop().create_task(wait())
    except RuntimeError:  # no running loop (shutdown): nothing waits for it
        return
    _FORGOTTEN.add(task)
    task.add_done_callback(_FORGOTTEN.discard)
