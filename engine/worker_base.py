"""What prefill and decode workers share: an engine, a transport endpoint, output streams, reports, stats.

start(monitor, scheduler) ─▶ every report_interval_ms: monitor.report(load()) if it changed, else once
                             every heartbeat_interval_ms                               (TetriInfer §3.2)
                                                        scheduler.record(state events)  (the request table)
                             called again after the monitor or the GlobalScheduler was re-created: rewires
subscribe(front door)     ─▶ that front door's one stream of token chunks from this worker, over ZeroMQ,
                             and on the Ray call itself a ``Heartbeat`` (this life's incarnation, the requests
                             held for that front door) every ``HEARTBEAT_S``
sentinel()                ─▶ never returns: the supervisor holds one call open and hears of this actor's death
stats()                   ─▶ the engine's own counters, the KV connector's, the transport's, the policies in force,
                             the length predictions' scores (``common/length_score.py``)

A worker is one life (``incarnation``) of a named actor: the supervisor
(``control_plane/supervisor.py``) re-creates it under the same name with the
next incarnation when it dies; everything it sends carries that number so the
others can drop what a previous life sent. Within a life the actor may change
role (a flip): the next role is built from the last (``predecessor``) and takes
over its engine, endpoint, streams and wiring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, TypedDict, Unpack

from tetriserve.channel.streams import StreamHub
from tetriserve.common.config import ClusterConfig
from tetriserve.common.length import LengthEstimate
from tetriserve.common.length_score import LengthScore
from tetriserve.common.load import DecodeLoad, PrefillLoad, same_load
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason, Heartbeat, StateEvent, StreamChunk, TokenLogprobs
from tetriserve.engine.ray_api import MonitorHandle, SchedulerHandle, WorkerHandle, cluster_nodes, node_ip_address
from tetriserve.transport.api import Received, TransferHandle, TransferState, Transport

if TYPE_CHECKING:
    from tetriserve.engine.loop import EngineLoop

logger = logging.getLogger(__name__)

HANDED_MEMORY = 4096  # requests handed on to another worker, remembered to forward a late abort
PULL_SETTLE_S = 0.1  # the longest a request whose KV is pulled waits for its last part before it starts


class ChunkFields(TypedDict, total=False):
    """The ``StreamChunk`` fields ``EngineWorker.chunk`` takes besides the request's own."""

    finish_reason: FinishReason | None
    error: str | None
    metrics: Mapping[str, float] | None
    moved_to: str | None
    retry: bool


def estimate_metrics(estimate: LengthEstimate | None) -> dict[str, float] | None:
    """A finished request's length estimate, as its last chunk's per-request ``metrics`` (the gRPC response's
    ``metrics``): the predicted output tokens and the range they were predicted in."""
    if estimate is None:
        return None
    return {
        "predicted_output_tokens": float(estimate.estimate),
        "predicted_output_tokens_lower": float(estimate.lower),
        "predicted_output_tokens_upper": float(estimate.upper),
    }


class EngineWorker:
    """Base of the worker actors; subclasses build ``self.engine`` and implement ``load`` and ``policies``."""

    engine: EngineLoop  # built by the subclass, unless taken over from a predecessor
    endpoint: Transport
    streams: StreamHub
    _events: list[StateEvent]
    _engine_events: deque[StateEvent]  # noted on the engine thread, moved to ``_events`` at each report
    _handed: OrderedDict[str, WorkerHandle]  # request id -> handle of the worker it went on to
    _pulls: dict[str, TransferHandle]  # KV key -> its pull in flight (``pull_kv``)
    _monitor: MonitorHandle | None
    _scheduler: SchedulerHandle | None
    length_score: LengthScore  # the length predictions of the requests that ended here

    def __init__(
        self, worker_id: str, config: ClusterConfig, incarnation: int = 0, predecessor: EngineWorker | None = None
    ) -> None:
        """``predecessor``: the role this worker played until a flip; its engine, endpoint, streams and wiring
        carry over (it must be ``retire``d first)."""
        from tetriserve.transport import endpoints

        self.worker_id = worker_id
        self.incarnation = incarnation
        self.config = config
        if predecessor is not None:
            self.endpoint, self.engine, self.streams = predecessor.endpoint, predecessor.engine, predecessor.streams
            self._events, self._handed, self._pulls = predecessor._events, predecessor._handed, predecessor._pulls
            self._engine_events = predecessor._engine_events
            self._monitor, self._scheduler = predecessor._monitor, predecessor._scheduler
            self.length_score = predecessor.length_score
        else:
            link = config.transport.emulate
            self.endpoint = endpoints.get_or_create(
                worker_id,
                config.transport.backend,
                f"{config.host}:0",
                (link.gbps, link.latency_us) if link is not None else None,
                config.transport.lease_s,
                across_hosts=config.transport.backend == "auto" and cluster_spans_hosts(),
                pull=config.transport.pull,
            )
            self.streams = StreamHub()
            self._events = []
            self._engine_events = deque()
            self._handed = OrderedDict()
            self._pulls = {}
            self._monitor = None
            self._scheduler = None
            self.length_score = LengthScore()
        self._report_task: asyncio.Task[None] | None = None
        self._reported: PrefillLoad | DecodeLoad | None = None  # the last load sent to the monitor
        self._reported_at = 0.0

    async def start(self, monitor: MonitorHandle, scheduler: SchedulerHandle | None = None) -> str:
        """Begin (or redirect) load reports to the ClusterMonitor and state events to the GlobalScheduler;
        returns the KV endpoint address to advertise."""
        self._monitor = monitor
        self._scheduler = scheduler
        self._reported = None  # a new monitor hears from this worker at once
        if self._report_task is None or self._report_task.done():
            self._report_task = asyncio.create_task(self._report_loop())
        return self.endpoint.address

    def idle(self) -> bool:
        """Nothing held: no request, no KV on its way out (a flip waits for this)."""
        raise NotImplementedError

    def evict(self, error: str) -> int:
        """End every request held here with a ``retry`` error, so the front doors migrate them with the tokens
        they have (a flip whose drain timed out); returns how many."""
        raise NotImplementedError

    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        raise NotImplementedError

    async def set_policy(self, changes: dict[str, object]) -> dict[str, str]:
        raise NotImplementedError

    def retire(self) -> None:
        """Stop this role's background work before a flip hands the engine to the other role."""
        if self._report_task is not None:
            self._report_task.cancel()
            self._report_task = None

    async def resume(self) -> None:
        """Start reports with the wiring taken over from the predecessor (after a flip)."""
        if self._monitor is not None:
            await self.start(self._monitor, self._scheduler)

    async def sentinel(self) -> None:
        """Never returns: a call the supervisor keeps open, so this actor's death reaches it at once."""
        await asyncio.Event().wait()

    def holding(self, subscriber: str) -> tuple[tuple[str, int], ...]:
        """(request id, attempt) of every request this worker holds for ``subscriber``."""
        raise NotImplementedError

    def load(self) -> PrefillLoad | DecodeLoad:
        raise NotImplementedError

    def policies(self) -> dict[str, str]:
        raise NotImplementedError

    def decisions(self) -> dict[str, dict[str, int]]:
        """What this worker's policies decided otherwise than the defaults, by policy and decision
        (``common/decisions.py``)."""
        return {}

    def stats(self) -> dict[str, object]:
        from tetriserve.transport import kv_counters

        return {
            "engine": self.engine.stats(),
            "kv": kv_counters.counters(),
            "transport": self.endpoint.stats(),
            "policy": self.policies(),
            "decisions": self.decisions(),
            "length_score": self.length_score.snapshot(),
        }

    # -- output streams and events ---------------------------------------------------------
    async def subscribe(self, subscriber: str, address: str) -> AsyncIterator[Heartbeat]:
        """A front door's one stream from this worker: the chunks of every request it sent here go to its socket
        at ``address``; this call stays open, yielding heartbeats, for as long as the front door listens."""
        async for heartbeat in serve_subscriber(lambda: self, subscriber, address):
            yield heartbeat

    def publish(
        self,
        subscriber: str,
        req: Request,
        tokens: tuple[int, ...],
        reason: FinishReason | None = None,
        error: str | None = None,
        *,
        index: int = 0,
        moved_to: str | None = None,
        retry: bool = False,
        logprobs: tuple[TokenLogprobs, ...] | None = None,
    ) -> None:
        """Send ``req``'s chunk to ``subscriber``: ``tokens`` (``logprobs``: theirs, if the request asked) from
        output position ``index`` on. A finish is also a state event for the GlobalScheduler's table (the front
        door's own finish usually gets there first); ``retry`` marks an error the request may get past
        elsewhere (the front door migrates it)."""
        metrics = estimate_metrics(req.length_estimate) if reason is not None else None
        chunk = self.chunk(
            req,
            tokens,
            index,
            finish_reason=reason,
            error=error,
            moved_to=moved_to,
            retry=retry,
            logprobs=logprobs,
            metrics=metrics,
        )
        self.streams.publish(subscriber, chunk)
        if reason is not None and not retry:
            est = req.length_estimate
            self.event(req.request_id, reason.state, reason.value, chunk.end, attempt=req.attempt, estimate=est)

    def chunk(
        self,
        req: Request,
        tokens: tuple[int, ...],
        index: int,
        *,
        logprobs: tuple[TokenLogprobs, ...] | None = None,
        **fields: Unpack[ChunkFields],
    ) -> StreamChunk:
        """``req``'s chunk from this worker: ``tokens`` from output position ``index`` on, ``logprobs`` (kept only
        where the request asked for them), and any other ``StreamChunk`` ``fields``; any thread may build one."""
        return StreamChunk(
            req.request_id,
            tokens,
            prompt_tokens=len(req.prompt_token_ids),
            worker=self.worker_id,
            index=index,
            attempt=req.attempt,
            incarnation=self.incarnation,
            logprobs=(logprobs or ()) if req.sampling.logprobs is not None else None,
            **fields,
        )

    def _subscriber_gone(self, subscriber: str) -> None:
        """The front door's stream has closed: nobody reads its requests any more (subclasses abort them)."""

    def event(
        self,
        request_id: str,
        state: RequestState,
        detail: str = "",
        output_tokens: int = 0,
        moved_to: str | None = None,
        *,
        attempt: int = 0,
        estimate: LengthEstimate | None = None,
    ) -> None:
        """Note a request's state change for the GlobalScheduler's table (sent with the next report), with the
        request's length ``estimate`` where the event brings one."""
        if self._scheduler is not None:
            now = time.time()
            self._events.append(
                StateEvent(request_id, state, now, self.worker_id, detail, output_tokens, moved_to, attempt, estimate)
            )

    def engine_event(self, request_id: str, state: RequestState, detail: str = "") -> None:
        """``event`` for the engine thread (a preemption seen in the engine's scheduler): thread-safe."""
        if self._scheduler is not None:
            self._engine_events.append(StateEvent(request_id, state, time.time(), self.worker_id, detail))

    def handed_on(self, request_id: str, handle: WorkerHandle) -> None:
        """``request_id`` continues on the worker behind ``handle``: later aborts go there."""
        self._handed[request_id] = handle
        while len(self._handed) > HANDED_MEMORY:
            self._handed.popitem(last=False)

    def forward_abort(self, request_id: str, attempt: int | None = None) -> bool:
        """Abort a request that went on to another worker, there; False if it never passed through here."""
        handle = self._handed.pop(request_id, None)
        if handle is not None:
            handle.abort.remote(request_id, attempt)
        return handle is not None

    def pull_kv(self, src: str, key: str) -> None:
        """Take ``key``'s KV, every part as it is published, from the endpoint at ``src`` into this one, one-sided
        (``transport/shm_pull.py``); the engine loads it from here as it would KV sent to it. A pull that fails
        marks the key failed here, and the load fails at once."""
        handle = self.endpoint.pull(src, key, self.config.transport.timeout_s)
        if handle is None:  # the publisher thought we could; we cannot (never between matching endpoints)
            self.endpoint.fail(key, f"{self.worker_id} cannot pull from {src}")
            return
        for done in [k for k, h in self._pulls.items() if h.state is not TransferState.PENDING]:
            del self._pulls[done]  # pulls whose request never came (refused, aborted): nothing waits for them
        self._pulls[key] = handle

    async def pulled(self, key: str, src: str | None = None) -> bool:
        """Before a request whose KV is pulled starts here: pull it from ``src`` (unless already pulling it), and
        wait, at most ``PULL_SETTLE_S``, until its last part has landed, so that the engine finds it here when it
        first schedules the request and loads it within that step (a pushed KV is not waited for). Returns
        whether its KV was pulled."""
        if src is not None and key not in self._pulls:
            self.pull_kv(src, key)
        handle = self._pulls.pop(key, None)
        if handle is not None:
            await handle.settled(PULL_SETTLE_S)  # woken by the pull's thread, not polled: no wake-ups meanwhile
        return handle is not None

    async def parked_kv(self, key: str, give_up: Callable[[], bool] = lambda: False) -> list[Received] | None:
        """The KV the engine parked in this endpoint under ``key`` (packed off the step that computed it), or
        None once ``give_up()``, its pack failed or the transfer deadline has passed."""
        deadline = time.monotonic() + self.config.transport.timeout_s
        while (buffers := self.endpoint.recv(key)) is None:
            if give_up() or self.endpoint.failed(key) is not None or time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.001)
        return buffers

    async def _report_loop(self) -> None:
        interval = self.config.report_interval_ms / 1000
        while True:
            try:
                self._report(self.load(), time.monotonic())
                while self._engine_events:
                    self._events.append(self._engine_events.popleft())
                if self._events and self._scheduler is not None:
                    events, self._events = self._events, []
                    self._scheduler.record.remote(events)
            except Exception:
                logger.exception("%s: load report failed", self.worker_id)
            await asyncio.sleep(interval)

    def _report(self, load: PrefillLoad | DecodeLoad, now: float) -> None:
        """Send ``load`` to the monitor if it differs from the last one sent or a heartbeat is due."""
        c = self.config
        due = now - self._reported_at >= c.heartbeat_interval_ms / 1000
        if not due and same_load(load, self._reported, c.report_tolerance):
            return
        if self._monitor is None:  # reports start with a monitor (``start``)
            raise RuntimeError(f"{self.worker_id}: no ClusterMonitor to report to")
        self._monitor.report.remote(load)
        self._reported, self._reported_at = load, now


async def serve_subscriber(
    worker: Callable[[], EngineWorker], subscriber: str, address: str
) -> AsyncIterator[Heartbeat]:
    """``subscribe``'s body; ``worker()`` is the role serving now (a flip changes it while the stream runs)."""

    def beat() -> Heartbeat:
        w = worker()
        return Heartbeat(w.worker_id, w.incarnation, w.holding(subscriber))

    try:
        async for heartbeat in worker().streams.serve(subscriber, address, beat):
            yield heartbeat
    finally:
        if not worker().streams.attached(subscriber):  # not a stream a newer one of this front door took over
            worker()._subscriber_gone(subscriber)


def cluster_spans_hosts() -> bool:
    """Whether this process's Ray cluster has a live node on another host (False outside Ray)."""
    import ray

    if not ray.is_initialized():
        return False
    here = node_ip_address()
    return any(node.get("Alive") and node.get("NodeManagerAddress") != here for node in cluster_nodes())


def build_worker_engine(config: ClusterConfig, model_path: str, worker_id: str) -> EngineLoop:
    """A worker's engine: one build serves either role, the worker's role takes it (``EngineLoop.take_role``)
    and a flip hands it to the other role without reloading it. Until then its scheduler is vLLM's own.
    With a core layout, the build runs on every core, vLLM's imports (most of a worker's start) included."""
    from tetriserve.engine.core_layout import CoreLayout, building_on

    layout = CoreLayout.from_env()
    with building_on(None if layout is None else layout.every):
        from tetriserve.engine.cores import claim_cores
        from tetriserve.engine.loop import EngineLoop
        from tetriserve.engine.settings import EngineRole, build_engine_args

        args = build_engine_args(
            config.engine,
            model_path,
            EngineRole.PREFILL,
            chunk_size=config.prefill.batch_ceiling(config.engine.max_model_len),
            endpoint=worker_id,
            transport=config.transport.backend,
            kv_deadline_s=config.transport.timeout_s,
            sync_load_bytes=int(config.transport.sync_load_mib * (1 << 20)),
            kv_load_failure_policy=config.kv_load_failure_policy,
        )
        return EngineLoop(
            args,
            worker_id,
            cores=claim_cores(config.engine.threads_per_engine, borrows=False),
            stream_interval_s=config.engine.stream_interval_ms / 1e3,
        )
