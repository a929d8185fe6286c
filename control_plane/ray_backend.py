"""``ServingBackend`` over a launched Ray cluster: what the front doors call (DESIGN.md §5b).

    generate(request):
        GlobalScheduler.place(PlacementRequest) ─▶ Placement(prefill worker)      a decision, not a relay
        prefill.submit(request, subscriber)
        chunks ◀══ this process's one stream from each worker (ZeroMQ; ``subscribe``) ══ prefill, then decode
               ─▶ the request's ``TokenLog``: in order, no duplicate, stale attempts dropped ─▶ caller
        finish ─▶ GlobalScheduler.record(finish event)

Streams are opened per worker, not per request, and stay open: a worker's
message carries every chunk of this process's requests that was ready, so the
message rate follows the engine's steps. Chunks arrive on one ZeroMQ socket of
this process; the Ray ``subscribe`` call to each worker only attaches it and
says when the worker is gone. They are bound to the event loop they were
opened in and reopened if that loop changes. An abort goes to the worker
the request is on now (the log knows, from ``moved_to`` markers); a worker it
has left forwards it.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tetriserve.common.request import Request
from tetriserve.common.stream import FinishReason, PlacementRequest, StateEvent, StreamChunk, decode_chunks
from tetriserve.control_plane.backend import ClusterStatus, WorkerPolicy, WorkerStatus
from tetriserve.control_plane.launcher import Cluster
from tetriserve.control_plane.policy_admin import Setter, apply_changes, parse_changes, resolve_targets
from tetriserve.control_plane.token_log import AT_ONCE, TokenLog

logger = logging.getLogger(__name__)

POLICIES_TIMEOUT_S = 2.0  # status: a worker that does not answer by then shows no policy
SET_POLICY_TIMEOUT_S = 30.0


@dataclass
class _Open:
    """A request this process is streaming: its chunks' queue and, once placed, its token log."""

    queue: asyncio.Queue[StreamChunk] = field(default_factory=asyncio.Queue)
    log: TokenLog | None = None


class _Streams:
    """This process's streams from every worker: one ZeroMQ PULL socket that every worker pushes this process's
    chunks to (routed to the requests' queues), and per worker the Ray ``subscribe`` call that attached it, which
    carries only heartbeats and fails when the worker is gone (``common/outbox.py``)."""

    def __init__(self, workers: dict[str, Any], host: str) -> None:
        import zmq
        import zmq.asyncio

        self.id = f"frontdoor-{uuid.uuid4().hex[:12]}"
        self.loop = asyncio.get_running_loop()
        self.requests: dict[str, _Open] = {}
        self._workers = workers
        self._socket = zmq.asyncio.Context.instance().socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"
        self._reader = self.loop.create_task(self._read())
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._refs: dict[str, Any] = {}
        for worker_id in workers:
            self.open(worker_id)

    def open(self, worker_id: str) -> None:
        """Open the stream from ``worker_id`` unless it is open."""
        task = self._tasks.get(worker_id)
        if task is not None and not task.done():
            return
        ref = self._workers[worker_id].subscribe.remote(self.id, self.address)
        self._refs[worker_id] = ref
        self._tasks[worker_id] = self.loop.create_task(self._watch(worker_id, ref))

    @property
    def healthy(self) -> bool:
        return all(not t.done() for t in self._tasks.values())

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
            for chunk in chunks:
                req = self.requests.get(chunk.request_id)
                if req is not None:
                    req.queue.put_nowait(chunk)

    async def _watch(self, worker_id: str, stream: Any) -> None:
        try:
            async for ref in stream:
                await ref  # a heartbeat
        except Exception as exc:
            logger.exception("stream %s from %s failed", self.id, worker_id)
            message = f"lost the stream from {worker_id}: {type(exc).__name__}"
            for rid, req in self.requests.items():  # the requests that are on that worker now
                if req.log is not None and req.log.worker == worker_id:
                    req.queue.put_nowait(
                        StreamChunk(rid, (), FinishReason.ERROR, message, worker="frontdoor", index=AT_ONCE)
                    )

    def close(self) -> None:
        import ray

        self._reader.cancel()
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

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_path(self) -> str:
        return self.cluster.model_path

    @property
    def max_model_len(self) -> int:
        return self.cluster.config.engine.max_model_len

    @property
    def _workers(self) -> dict[str, Any]:
        return {**self.cluster.prefill, **self.cluster.decode}

    def streams(self) -> _Streams:
        """This event loop's streams from every worker (opened on first use, reopened if one ended)."""
        loop = asyncio.get_running_loop()
        if self._streams is None or self._streams.loop is not loop:
            self._streams = _Streams(self._workers, _stream_host(self.cluster.config))
        elif not self._streams.healthy:
            for worker_id in self._workers:
                self._streams.open(worker_id)
        return self._streams

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        streams = self.streams()
        rid = request.request_id
        req = streams.requests[rid] = _Open()
        try:
            meta = PlacementRequest(
                rid,
                len(request.prompt_token_ids),
                request.sampling.max_tokens,
                request.arrival_time,
                request.attempt,
            )
            placement = await self.cluster.scheduler.place.remote(meta)
            if placement.prefill_worker is None:
                yield StreamChunk(rid, (), FinishReason.ERROR, placement.error)
                return
            log = req.log = TokenLog(rid, placement.prefill_worker, request.attempt)
            submitted = self.cluster.prefill[placement.prefill_worker].submit.remote(request, streams.id)
            watch = asyncio.ensure_future(_report_failure(submitted, req.queue, rid, placement.prefill_worker))
            while not log.done:
                for chunk in log.add(await req.queue.get()):
                    yield chunk
        finally:
            streams.requests.pop(rid, None)
            if req.log is not None:
                watch.cancel()
                self._finished(request, req.log)

    def _finished(self, request: Request, log: TokenLog) -> None:
        """Tell the table how the request ended; abort it where it is if the caller left before the end."""
        finish = log.finish
        reason = finish.finish_reason if finish is not None and finish.finish_reason else FinishReason.ABORT
        if finish is None or finish.worker != log.worker:  # the caller gave up, or the end did not come from there
            self._workers[log.worker].abort.remote(request.request_id)
        event = StateEvent(request.request_id, reason.state, time.time(), "frontdoor", reason.value, len(log.tokens))
        self.cluster.scheduler.record.remote([event])

    def close(self) -> None:
        """Drop the streams (call from the loop that used the backend)."""
        if self._streams is not None:
            self._streams.close()
            self._streams = None

    async def abort(self, request_id: str, reason: str = "abort") -> bool:
        req = self._streams.requests.get(request_id) if self._streams is not None else None
        if req is None:
            return False
        req.queue.put_nowait(StreamChunk(request_id, (), FinishReason(reason), worker="frontdoor", index=AT_ONCE))
        return True

    async def healthy(self) -> bool:
        try:
            await asyncio.wait_for(self.cluster.scheduler.status.remote(), timeout=5)
            members = await asyncio.wait_for(self.cluster.monitor.snapshot.remote(), timeout=5)
        except Exception:
            return False
        return all(m["state"] == "serving" for m in members)

    async def status(self) -> ClusterStatus:
        members, sched, policies = await asyncio.gather(
            self.cluster.monitor.snapshot.remote(), self.cluster.scheduler.status.remote(), self._policies()
        )
        workers = tuple(
            WorkerStatus(m["worker_id"], m["role"], m["state"], m["load"], policies.get(m["worker_id"], {}))
            for m in members
        )
        return ClusterStatus(self._model_name, workers, int(sched["in_flight"]), self.cluster.dashboard_url)

    async def _policies(self) -> dict[str, dict[str, str]]:
        """Every worker's ``policies()``, asked in parallel; ``{}`` for one that fails or is late."""
        handles = self._workers

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


async def _report_failure(submitted: Any, queue: asyncio.Queue[StreamChunk], rid: str, worker_id: str) -> None:
    """End the request's stream with an error if its prefill worker could not take it."""
    try:
        await submitted
    except Exception as exc:
        logger.error("request %s: %s could not take it: %s", rid, worker_id, type(exc).__name__)
        error = f"prefill worker {worker_id} is unavailable"
        queue.put_nowait(StreamChunk(rid, (), FinishReason.ERROR, error, worker="frontdoor", index=AT_ONCE))
