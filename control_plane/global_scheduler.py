"""GlobalScheduler (TetriInfer §3.2): places requests and keeps the request table; never touches tokens.

    front door ──place(PlacementRequest)──▶ least-loaded prefill worker ──Placement──▶ front door
    front door ──submit(request)──▶ that prefill worker; tokens flow worker ══▶ front door directly
    workers, front doors ──record([StateEvent, ...])──▶ the table: each request's timestamped events

TetriInfer's global scheduler also receives the output streams; this one does
not, on purpose: relaying every token through one actor adds that actor's hops
and queues to every token's latency (``docs/design/index.md``). The table is kept from events the workers batch with
their load reports (and the front door's finish), so it may trail the tokens by
a report interval. A request's first finish event is its outcome.

Least load = this scheduler's own count of requests placed on the worker and not
yet past prefill (exact for its own placements, corrected by events) with the
worker's last reported queued prompt tokens (broadcast by the ClusterMonitor)
as the tie-breaker, then its reported running requests: between colocated workers with empty queues, the one
decoding fewer streams. With prefix placement (``prefill.placement: prefix``, the default) a worker expected to
hold a longer prefix of the prompt in its cache takes it instead when the compute saved outweighs its longer
queue (``control_plane/prefix_placement.py``); the expected hits are counted (``placed_by_prefix``,
``prefix_hit_tokens``).

Only workers in the monitor's latest broadcast (those ``serving`` by its
clock) are placed on; a request the front door re-places after a failure
(a later ``attempt``) replaces its old entry, and goes elsewhere than the
workers it names in ``avoid`` when another serves. Nothing refuses a request
for lack of a worker for good: ``Placement.retry`` tells the front door to ask
again shortly. Admission is bounded per worker: a new request goes
only to a prefill worker with fewer than ``admission.max_queued_per_worker``
requests in prefill whose queue it would wait behind for at most
``admission.max_wait_s`` (the worker's reported ``queue_wait_s``, from its cost
model or measured pace, plus the prompts placed on it since at its reported ``seconds_per_token``). When none has
room it is refused with ``retry_after_s`` (the front door answers 429 /
RESOURCE_EXHAUSTED); a re-placed request (a later attempt) never is.

If this actor dies, the supervisor re-creates it with an empty table; running
streams never pass through here, so they go on untouched.

Every method is a coroutine, so Ray runs this actor on one event loop: calls
never interleave (a threaded actor would race on the table).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from tetriserve.common.admission_config import RETRY_AFTER_MAX_S, AdmissionConfig
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import Placement, PlacementRequest, StateEvent
from tetriserve.common.tracing_config import TracingConfig
from tetriserve.control_plane.batched_calls import OneCallOut
from tetriserve.control_plane.handles import SchedulerStatus, WorkerHandle
from tetriserve.control_plane.prefix_placement import PrefixIndex
from tetriserve.control_plane.prefix_placement import Queue as PrefixQueue
from tetriserve.observability import tracing

logger = logging.getLogger(__name__)

REFUSAL_LOG_INTERVAL_S = 5.0  # at most one warning about refusals this often

_PLACEHOLDER_PROMPT = (0,)  # the table keeps no prompts: only their length (``prompt_tokens``)


@dataclass(frozen=True)
class _Queue:
    count: int  # requests placed on the worker and not past prefill (this scheduler's own count)
    tokens: int  # prompt tokens the worker last reported queued (the tie-breaker)
    wait_s: float  # expected seconds a new request would wait behind them
    running: int = 0  # requests past the queue the worker last reported (a colocated worker's decodes)


FEEDBACK_TIMEOUT_S = 30.0  # one call of finished requests' lengths to a prefill worker


class GlobalScheduler:
    def __init__(
        self,
        prefill: dict[str, WorkerHandle],
        history: int = 1000,
        limits: AdmissionConfig | None = None,
        tracing_config: TracingConfig | None = None,
        prefix_block_size: int = 0,
    ) -> None:
        """``prefix_block_size``: the engines' KV block size, with which prefix placement is on (0: off)."""
        if tracing_config is not None:  # an actor of the service (tests build it bare)
            tracing.setup_process(tracing_config, "global-scheduler")
        self.prefill = prefill
        self.limits = limits or AdmissionConfig()
        self.table: dict[str, Request] = {}
        self.prompt_tokens: dict[str, int] = {}
        self.finished: deque[Request] = deque(maxlen=history)
        self._finished_ids: OrderedDict[str, Request] = OrderedDict()  # the same, by id (late reports land there)
        self._history = history
        self.prefill_loads: dict[str, PrefillLoad] = {}
        self._refusal_logged = -math.inf
        self._feedbacks: dict[str, OneCallOut[tuple[int, int], None]] = {}
        self.counts = {"admitted": 0, "finished": 0, "aborted": 0, "errors": 0, "moved": 0, "refused": 0}
        self.prefix = PrefixIndex(prefix_block_size) if prefix_block_size > 0 else None
        self.placement_counts = {"placed_by_prefix": 0, "prefix_hit_tokens": 0}

    async def update_prefill_loads(self, loads: list[PrefillLoad]) -> None:
        """The monitor's broadcast: the prefill workers serving now, with their loads."""
        if self.prefix is not None:
            for ld in loads:
                old = self.prefill_loads.get(ld.worker_id)
                if old is not None and old.incarnation != ld.incarnation:  # a new life: its cache is empty
                    self.prefix.forget(ld.worker_id)
                self.prefix.capacity(ld.worker_id, ld.total_kv_blocks)
        self.prefill_loads = {ld.worker_id: ld for ld in loads}

    async def set_prefill(self, worker_id: str, handle: WorkerHandle) -> None:
        """A prefill worker's new life (the supervisor re-created it)."""
        self.prefill[worker_id] = handle
        if self.prefix is not None:
            self.prefix.forget(worker_id)

    async def remove_prefill(self, worker_id: str) -> None:
        """A prefill worker removed or flipped to decode: no more placements there."""
        self.prefill.pop(worker_id, None)
        self.prefill_loads.pop(worker_id, None)
        if self.prefix is not None:
            self.prefix.forget(worker_id)

    async def sentinel(self) -> None:
        """Never returns: a call the supervisor keeps open, so this actor's death reaches it at once."""
        await asyncio.Event().wait()

    # -- placement ---------------------------------------------------------------------------
    async def place(self, meta: PlacementRequest) -> Placement:
        """Choose the prefill worker for a request and enter it in the table (a ``tetriserve.place`` span)."""
        started = tracing.now_ns()
        placement = self._place(meta)
        trace_placement(meta, placement, started)
        return placement

    async def place_many(self, metas: list[PlacementRequest]) -> list[Placement]:
        """``place`` each of ``metas``, in order, in one call: a front door's requests that asked while its
        previous call was out (``batched_calls.py``)."""
        return [await self.place(meta) for meta in metas]

    def _place(self, meta: PlacementRequest) -> Placement:
        rid = meta.request_id
        held = self.table.get(rid)
        if held is not None and held.attempt >= meta.attempt:
            return Placement(rid, None, f"request id {rid} is already in flight")
        serving = [w for w in self.prefill if w in self.prefill_loads]
        if not serving:
            return Placement(rid, None, "no prefill worker is serving", retry=True)
        candidates = [w for w in serving if w not in meta.avoid] or serving
        queues = self._queues(candidates)
        if meta.attempt == 0:  # a re-placement (its worker was lost) was admitted already: never refused
            candidates = [w for w in candidates if self._has_room(queues[w])]
            if not candidates:
                return self._refuse(rid, queues)
        worker = min(candidates, key=lambda w: (queues[w].count, queues[w].tokens, queues[w].running, w))
        if self.prefix is not None and meta.prefix_blocks:
            worker = self._prefer_prefix(worker, candidates, queues, meta.prefix_blocks)
        req = Request(rid, _PLACEHOLDER_PROMPT, arrival_time=meta.arrival_time, attempt=meta.attempt)
        req.prefill_worker = worker
        req.advance(RequestState.PREFILLING, worker)
        self.table[rid] = req
        self.prompt_tokens[rid] = meta.prompt_tokens
        self.counts["admitted"] += 1
        return Placement(rid, worker)

    def _prefer_prefix(
        self, base: str, candidates: list[str], queues: dict[str, _Queue], hashes: tuple[int, ...]
    ) -> str:
        """Least-load's choice ``base``, or the worker whose expected prefix hit saves more than its queue costs;
        the prompt's blocks are then that worker's most recent."""
        assert self.prefix is not None
        pace = {w: ld.seconds_per_token for w, ld in self.prefill_loads.items()}
        views = {w: PrefixQueue(queues[w].wait_s, pace.get(w, 0.0)) for w in candidates}
        choice = self.prefix.prefer(base, candidates, hashes, views)
        self.prefix.placed(choice.worker, hashes)
        self.placement_counts["placed_by_prefix"] += int(choice.by_prefix)
        self.placement_counts["prefix_hit_tokens"] += choice.hit_tokens
        return choice.worker

    def _queues(self, candidates: list[str]) -> dict[str, _Queue]:
        """Each candidate's queue: requests placed on it and not past prefill, the prompt tokens it last reported
        queued, and the expected wait behind them (its reported wait, plus the prompts placed since)."""
        count: dict[str, int] = dict.fromkeys(candidates, 0)
        fresh: dict[str, int] = dict.fromkeys(candidates, 0)
        for rid, req in self.table.items():
            worker = req.prefill_worker
            if req.state <= RequestState.PREFILLING and worker in count:
                count[worker] += 1
                ld = self.prefill_loads.get(worker)
                if ld is not None and req.events[-1].at > ld.at:  # placed after the worker's last report
                    fresh[worker] += self.prompt_tokens.get(rid, 0)
        queues = {}
        for w in candidates:
            ld = self.prefill_loads.get(w)
            tokens = ld.queued_prompt_tokens if ld else 0
            wait = (ld.queue_wait_s + fresh[w] * ld.seconds_per_token) if ld else 0.0
            queues[w] = _Queue(count[w], tokens, wait, ld.running if ld else 0)
        return queues

    def _has_room(self, queue: _Queue) -> bool:
        return queue.count < self.limits.max_queued_per_worker and queue.wait_s <= self.limits.max_wait_s

    def _refuse(self, rid: str, queues: dict[str, _Queue]) -> Placement:
        self.counts["refused"] += 1
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL_S:  # an operator sees why, not every refusal
            self._refusal_logged = now
            logger.warning(
                "refusing requests (%d so far): every prefill worker is full: %s",
                self.counts["refused"],
                "; ".join(self._describe(w, q) for w, q in queues.items()),
            )
        shortest = min(q.wait_s for q in queues.values())
        retry_after = max(1, min(RETRY_AFTER_MAX_S, math.ceil(shortest - self.limits.max_wait_s)))
        message = (
            f"overloaded: every prefill worker is full (the shortest queue would take {shortest:.0f} s, the bound "
            f"is {self.limits.max_wait_s:g} s; at most {self.limits.max_queued_per_worker} requests each)"
        )
        return Placement(rid, None, message, retry_after_s=retry_after)

    def _describe(self, worker: str, queue: _Queue) -> str:
        """One prefill worker's queue as a refusal's log line gives it."""
        text = f"{worker}: {queue.count} placed, {queue.wait_s:.1f} s of queue"
        ld = self.prefill_loads.get(worker)
        if ld is None:
            return text
        return (
            f"{text} (reported {ld.queue_wait_s:.1f} s, {ld.queued_prompt_tokens} tokens queued, "
            f"{1e3 * ld.seconds_per_token:.3f} ms/token)"
        )

    # -- the table ----------------------------------------------------------------------------
    async def record(self, events: list[StateEvent]) -> None:
        """Apply a batch of state events (from a worker's report, or a front door's finish)."""
        for ev in sorted(events, key=lambda e: e.at):
            req = self.table.get(ev.request_id)
            if req is None:  # finished already (a worker's report can come after the front door's finish), or unknown
                done = self._finished_ids.get(ev.request_id)
                if done is not None and ev.attempt == done.attempt:
                    if ev.estimate is not None:  # the worker's finish: the estimate the request ended with
                        done.length_estimate = ev.estimate
                    if not ev.state.finished:
                        done.observe_late(ev.state, ev.at, ev.detail)
                continue
            if ev.state.finished and ev.attempt != req.attempt:  # the end of an attempt that was replaced
                continue
            if ev.moved_to is not None and ev.state is RequestState.TRANSFERRING:  # an SCLS slice move
                req.decode_worker = ev.moved_to
                self.counts["moved"] += 1
            elif ev.moved_to is not None and req.decode_worker is None:  # the handoff (unless a move came first)
                req.decode_worker = ev.moved_to
            req.observe(ev.state, ev.at, ev.detail)
            if ev.estimate is not None:
                req.length_estimate = ev.estimate
            if ev.state.finished:
                self._close(req, ev)

    def _close(self, req: Request, ev: StateEvent) -> None:
        self.table.pop(req.request_id, None)
        prompt_tokens = self.prompt_tokens.pop(req.request_id, 0)
        self.finished.append(req)
        self._finished_ids[req.request_id] = req
        while len(self._finished_ids) > self._history:
            self._finished_ids.popitem(last=False)
        if ev.state is RequestState.FINISHED_ABORTED:
            self.counts["aborted"] += 1
        elif ev.state is RequestState.FINISHED_ERROR:
            self.counts["errors"] += 1
        else:
            self.counts["finished"] += 1
            worker = req.prefill_worker or ""
            if worker in self.prefill:  # the predictor's online feedback, many to a call (``batched_calls.py``)
                self._feedback(worker).tell((prompt_tokens, ev.output_tokens))

    def _feedback(self, worker: str) -> OneCallOut[tuple[int, int], None]:
        out = self._feedbacks.get(worker)
        if out is None:
            out = self._feedbacks[worker] = OneCallOut(lambda: self.prefill[worker].observe_many, FEEDBACK_TIMEOUT_S)
        return out

    async def status(self) -> SchedulerStatus:
        return {
            "in_flight": len(self.table),
            "counts": dict(self.counts),
            "placements": dict(self.placement_counts),
            "at": time.time(),
        }

    async def recent(self, n: int = 50) -> list[Request]:
        return list(self.finished)[-n:]


def trace_placement(meta: PlacementRequest, placement: Placement, started_ns: int) -> None:
    """The ``tetriserve.place`` span of one decision, under the request's span at its front door."""
    if not tracing.enabled():
        return
    worker = placement.prefill_worker
    outcome = (
        "placed"
        if worker
        else "refused"
        if placement.retry_after_s is not None
        else "retry"
        if placement.retry
        else "rejected"
    )
    attributes: dict[str, str | int] = {
        "tetriserve.request_id": meta.request_id,
        "tetriserve.attempt": meta.attempt,
        "tetriserve.prompt_tokens": meta.prompt_tokens,
        "tetriserve.prefill_worker": worker or "",
        "tetriserve.outcome": outcome,
    }
    error = placement.error if outcome in ("refused", "rejected") else None
    tracing.record("tetriserve.place", meta.trace, started_ns, attributes, error)
