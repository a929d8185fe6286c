"""The request router over a launched Ray cluster (``RequestRouter``): what the front doors call per request.

    generate(request):
        GlobalScheduler.place_many([PlacementRequest]) ─▶ [Placement(prefill worker)]   a decision, not a relay
        prefill.submit(request) ─▶ over this process's intake to the worker (ZeroMQ), or Ray where it has none
        chunks ◀══ this process's one stream from each worker (ZeroMQ; ``subscribe``) ══ prefill, then decode
               ─▶ the request's ``TokenLog``: in order, no duplicate, stale attempts dropped ─▶ caller
        lost  ─▶ migrate: next attempt, placed again with the tokens the caller already has (``resume``)
        finish ─▶ GlobalScheduler.record(finish event)

Streams are opened per worker, not per request, and stay open (``worker_streams.py``): a worker's message
carries every chunk of this process's requests that was ready, so the message rate follows the engine's steps.
An abort goes to the worker the request is on now (the log knows, from ``moved_to`` markers); a worker it has
left forwards it. Submits and aborts take the intake (``channel/intake.py``) where the worker is attached.

A stream that fails with Ray's ``ActorDiedError`` tells the monitor at once (``mark_dead``): its next broadcast
leaves that life out of placement and dispatch before the supervisor has noticed, so the requests migrated off
it are not handed back to it.

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
``UNAVAILABLE``). When every prefill worker is full (the GlobalScheduler's
per-worker bound) ``generate`` raises ``Overloaded`` before its first chunk
(429 / ``RESOURCE_EXHAUSTED``).

This is the request path only; the administration of the same cluster (health, status, flips, scaling,
policies) is ``RayAdmin`` (``frontdoor/ray_admin.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from tetriserve.channel.intake import Abort, Submit
from tetriserve.common.prefix_blocks import block_hashes
from tetriserve.common.request import Request
from tetriserve.common.stream import (
    FinishReason,
    Placement,
    PlacementRequest,
    StateEvent,
    StreamChunk,
)
from tetriserve.control_plane.batched_calls import OneCallOut
from tetriserve.control_plane.handles import WorkerHandle
from tetriserve.frontdoor.admission import Overloaded
from tetriserve.frontdoor.cluster_handles import ClusterHandles, Control
from tetriserve.frontdoor.token_log import AT_ONCE, TokenLog
from tetriserve.frontdoor.worker_streams import Lost, OpenRequest, WorkerStreams, stream_host

logger = logging.getLogger(__name__)

PLACE_TIMEOUT_S = 5.0  # one ``place`` call (the GlobalScheduler may be restarting)


class RayBackend:
    """``RequestRouter`` over a launched Ray cluster: placement, the workers' streams, migration."""

    def __init__(self, cluster: ClusterHandles, model_name: str) -> None:
        # a launched ``Cluster`` of this process's own, or a ``RemoteCluster`` (the detached control plane's)
        self.cluster = cluster
        self._model_name = model_name
        self._streams: WorkerStreams | None = None
        # a burst's placements go to the GlobalScheduler many to a call (``control_plane/batched_calls.py``)
        self._placements: OneCallOut[PlacementRequest, Placement] = OneCallOut(
            lambda: self.cluster.scheduler.place_many, PLACE_TIMEOUT_S
        )
        config = getattr(cluster, "config", None)
        self.migration_limit = int(getattr(config, "migration_limit", 3))
        self.idle_timeout_s = float(getattr(config, "stream_idle_timeout_s", 15.0))
        self.placement_timeout_s = float(getattr(config, "placement_timeout_s", 60.0))
        # prefix placement reads the prompt's block hashes (``control_plane/prefix_placement.py``); 0: none sent
        self.prefix_block_size = int(getattr(config, "prefix_block_size", 0))
        self.migrations: Counter[str] = Counter()  # attempts lost and placed again, by cause (the metrics')

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_path(self) -> str:
        return self.cluster.model_path

    @property
    def max_model_len(self) -> int:
        return self.cluster.config.engine.max_model_len

    def streams(self) -> WorkerStreams:
        """This event loop's streams from every worker (opened on first use, reopened if one ended)."""
        loop = asyncio.get_running_loop()
        if self._streams is None or self._streams.loop is not loop:
            died = None if getattr(self.cluster, "monitor", None) is None else self._worker_died
            host = stream_host(self.cluster.config)
            workers = functools.partial(worker_handles, self.cluster)
            self._streams = WorkerStreams(workers, host, self.idle_timeout_s, died)
        return self._streams

    def _worker_died(self, worker_id: str, incarnation: int) -> None:
        """A stream found that life of ``worker_id`` dead: the monitor leaves it out of placement and dispatch now."""
        _forget(self.cluster.monitor.mark_dead.remote(worker_id, incarnation))

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        streams = self.streams()
        rid = request.request_id
        log = TokenLog(rid, "", request.attempt)
        req = streams.requests[rid] = OpenRequest(log)
        avoid: tuple[str, ...] = ()
        started, first_at = time.monotonic(), None
        try:
            for moves in range(self.migration_limit + 1):
                attempt = request if moves == 0 else replace(request, attempt=log.attempt + 1, resume=tuple(log.tokens))
                placement = await self._place(attempt, avoid)
                if placement.retry_after_s is not None:  # every prefill worker is full (a first attempt only)
                    raise Overloaded(placement.error or "overloaded", placement.retry_after_s)
                if placement.prefill_worker is None:
                    error, retry = placement.error, placement.retry
                    yield StreamChunk(rid, (), FinishReason.ERROR, error, index=AT_ONCE, retry=retry)
                    return
                worker = placement.prefill_worker
                log.restart(attempt.attempt, worker)
                req.seen = time.monotonic()
                req.over_ray = not streams.send(worker, Submit(attempt))  # else over Ray, watched for its failure
                watch = None
                if req.over_ray:
                    submitted = worker_handles(self.cluster)[worker].submit.remote(attempt, streams.id)
                    watch = asyncio.ensure_future(_report_failure(submitted, req, worker))
                try:
                    lost = None
                    while not log.done and lost is None:
                        item = await req.queue.get()
                        if isinstance(item, Lost):
                            lost = item if item.attempt == log.attempt else None
                        elif item.retry and item.finished and item.attempt == log.attempt:
                            why = item.error or "a worker gave up on it"
                            lost = Lost(item.attempt, item.worker, why, "worker_gave_up")
                        else:
                            for chunk in log.add(item):
                                if first_at is None and chunk.token_ids:
                                    first_at = time.monotonic()
                                yield chunk
                finally:
                    if watch is not None:
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
                self._abort_everywhere(rid, lost.attempt, req)
                avoid = (*avoid, lost.worker) if lost.worker not in avoid else avoid
                if moves < self.migration_limit:
                    self.migrations[lost.cause] += 1
            assert lost is not None  # an attempt that was not lost returned above
            error = f"service unavailable: the request was lost {self.migration_limit + 1} times ({lost.reason})"
            yield StreamChunk(rid, (), FinishReason.ERROR, error, index=AT_ONCE, retry=True)
        finally:
            streams.requests.pop(rid, None)
            if log.worker:
                self._finished(request, log, req)
                self._observe(request, log, started, first_at)

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
            trace=request.trace,
            prefix_blocks=block_hashes(request.prompt_token_ids, self.prefix_block_size)
            if self.prefix_block_size
            else (),
        )
        deadline = time.monotonic() + self.placement_timeout_s
        why = "no prefill worker is serving"
        while True:
            try:
                placement = await self._placements.ask(meta)
                if placement.prefill_worker is not None and placement.prefill_worker in worker_handles(self.cluster):
                    return placement
                if not placement.retry:
                    return placement
                why = placement.error or why
            except Exception as exc:  # the GlobalScheduler is down or restarting
                why = f"the global scheduler is unavailable ({type(exc).__name__})"
            if time.monotonic() >= deadline:
                return Placement(rid, None, f"service unavailable: {why}", retry=True)
            await asyncio.sleep(0.2)

    def _abort_everywhere(self, request_id: str, attempt: int, req: OpenRequest) -> None:
        """Abort a lost attempt on every worker that may still hold it (it may have reached a decode worker)."""
        for worker_id in worker_handles(self.cluster):
            self._abort(worker_id, request_id, attempt, req)

    def _abort(self, worker_id: str, request_id: str, attempt: int, req: OpenRequest) -> None:
        """Over the worker's intake, or over Ray where it has none or got the attempt over Ray (so that the abort
        cannot overtake the submit)."""
        over_ray = req.over_ray and worker_id == req.log.worker
        if over_ray or self._streams is None or not self._streams.send(worker_id, Abort(request_id, attempt)):
            handle = worker_handles(self.cluster).get(worker_id)
            if handle is not None:
                _forget(handle.abort.remote(request_id, attempt))

    def _finished(self, request: Request, log: TokenLog, req: OpenRequest) -> None:
        """Tell the table how the request ended; abort it where it is if the caller left before the end."""
        finish = log.finish
        reason = finish.finish_reason if finish is not None and finish.finish_reason else FinishReason.ABORT
        if finish is None or finish.worker != log.worker:  # the caller gave up, or the end did not come from there
            self._abort(log.worker, request.request_id, log.attempt, req)
        rid, n = request.request_id, len(log.tokens)
        event = StateEvent(rid, reason.state, time.time(), "frontdoor", reason.value, n, attempt=log.attempt)
        _forget(self.cluster.scheduler.record.remote([event]))  # at once: the history shows it when the stream ends

    def _observe(self, request: Request, log: TokenLog, started: float, first_at: float | None) -> None:
        """A request that ended normally counts toward SLO attainment (the ``slo`` flip policy's input)."""
        control = control_of(self.cluster)
        finish = log.finish
        if control is None or first_at is None or finish is None or finish.finish_reason not in _NORMAL_ENDS:
            return
        now = time.monotonic()
        n = len(log.tokens)
        tpot_ms = (now - first_at) * 1e3 / (n - 1) if n > 1 else None
        control.observe_slo((first_at - started) * 1e3, tpot_ms, request.slo.ttft_ms, request.slo.tbt_ms)

    def close(self) -> None:
        """Drop the streams (call from the loop that used the backend)."""
        if self._streams is not None:
            self._streams.close()
            self._streams = None

    async def abort(self, request_id: str, reason: str = "abort") -> bool:
        req = self._streams.requests.get(request_id) if self._streams is not None else None
        if req is None:
            return False
        attempt = req.log.attempt
        chunk = StreamChunk(request_id, (), FinishReason(reason), worker="frontdoor", index=AT_ONCE, attempt=attempt)
        req.queue.put_nowait(chunk)
        return True


async def _report_failure(submitted: Awaitable[object], req: OpenRequest, worker_id: str) -> None:
    """The request's attempt is lost if its prefill worker could not take it (dead, or dying)."""
    try:
        await submitted
    except Exception as exc:
        logger.warning("request: %s could not take it: %s", worker_id, type(exc).__name__)
        req.lose(worker_id, f"prefill worker {worker_id} is unavailable ({type(exc).__name__})", "worker_unavailable")


_NORMAL_ENDS = (FinishReason.STOP, FinishReason.LENGTH)
_FORGOTTEN: set[asyncio.Task[None]] = set()  # fire-and-forget calls still in flight (tasks need a reference)


def _forget(ref: Awaitable[object]) -> None:
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


def worker_handles(cluster: ClusterHandles) -> dict[str, WorkerHandle]:
    """Every worker's current handle (the supervisor replaces one it re-creates)."""
    return {**cluster.prefill, **cluster.decode}


def control_of(cluster: object) -> Control | None:
    """The control plane's calls (a launched ``Cluster``'s own, or the ControlPlane actor's through a
    ``RemoteCluster``); None for a cluster without them (tests' fakes)."""
    control: Callable[[], Control] | None = getattr(cluster, "control", None)
    return control() if callable(control) else None
