"""The decode engine's vLLM scheduler subclass (``scheduler_cls``): it translates, the planner decides.

Each ``schedule()`` call:

    1. the step's start goes to the planner's step-time estimate (``DecodePlanner.observe_step``)
    2. every waiting request that would *start decoding* now is viewed (context, tokens generated, the
       predicted length range and the TBT SLO from the ``EngineTags`` in ``SamplingParams.extra_args``)
       and put to ``DecodePlanner.admit`` with the free KV; the ones it holds are taken out of vLLM's
       queues for this one call. A request whose KV has yet to come through the connector is not asked
       (below): when its KV has already landed and is small enough to load within the step
       (``transport.sync_load_mib``), it starts decoding in that same step, unasked
    3. when the batch may run out of KV this step (``DecodePlanner.may_run_out``), the running list is
       sorted so that vLLM, which preempts from its tail, preempts in the planner's victim sequence
       (CacheOpt §3.4); a preemption swaps or recomputes as the planner chooses (CacheOpt §3.5)
    4. SCLS slices (§7): a request the worker has marked to move (``mark_moving``) that the planner finds
       at its slice boundary has its ``max_tokens`` cut to this step's token, and the connector parks its
       KV, which the worker ships to the destination when the engine reports the request finished
       (``length``); then ``super().schedule()``

Every policy decision is ``decode_worker/planner.py``'s, over views and the time this class reads; what is
left here is vLLM's vocabulary — its queues, request objects, block pool and connector — and the two engine
facts the planner is not asked about: which waiting requests vLLM must pass unasked (KV still to land, a
blocked status), and that no slice is cut in a step that may run out of KV.

Only the engine thread calls into this class (the engine has one owner:
``docs/design/ownership.md``): the worker changes policies and marks slice moves
through ``EngineLoop.call`` and reads the frozen ``DecodeSnapshot`` the engine
thread publishes (``snapshot``).

A request that still has to pull its KV through the connector (no blocks yet) is
never held: it must get its blocks so its KV can land; it is gated once its KV
is in, holding those blocks. A request swapped out (CacheOpt §3.5) comes back the
same way; one preempted by recomputation has no KV to pull and is asked like any
other waiting request, its TBT slack counted from its preemption (CacheOpt §3.3.2).
Every preemption is counted and timed until the request decodes again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeGuard

from vllm.v1.core.sched.scheduler import Scheduler

from tetriserve.common.decisions import decisions_of
from tetriserve.common.engine_tags import EngineTags, tags_of
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import AdmissionPolicy
from tetriserve.decode_worker.planner import DecodePlanner, SliceProgress
from tetriserve.decode_worker.preemption import PreemptionOrder, PreemptionStrategy
from tetriserve.decode_worker.preemption.stats import PreemptionStats
from tetriserve.decode_worker.views import DecodeReqView, DecodeSnapshot, DecodeState, predicted_remaining
from tetriserve.engine.role_scheduler import RoleScheduler, retag
from tetriserve.transport.instructions import KVMode, instruction_of

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.request import Request


class _TracksTransfers(Protocol):
    """A connector that knows which requests' KV is still on its way (``transport/kv_connector.py``)."""

    def in_flight(self) -> set[str]: ...


class _ParksSlices(Protocol):
    """A connector that parks a running request's KV at its slice boundary (SCLS §7)."""

    def park_running(self, request: Request, block_ids: list[int], key: str) -> None: ...


class _Swaps(Protocol):
    """A connector that swaps a preempted request's KV out (CacheOpt §3.5)."""

    def swap_out(self, request: Request, block_ids: list[int], num_tokens: int) -> str: ...


def _tracks_transfers(connector: object) -> TypeGuard[_TracksTransfers]:
    return hasattr(connector, "in_flight")


def _parks_slices(connector: object) -> TypeGuard[_ParksSlices]:
    return hasattr(connector, "park_running")


def _swaps(connector: object) -> TypeGuard[_Swaps]:
    return hasattr(connector, "swap_out")


def _tags(req: Request) -> EngineTags:
    """The tetriserve tags a vLLM request carries (``NO_TAGS`` for one without)."""
    params = req.sampling_params
    return tags_of(params.extra_args if params is not None else None)


def _max_tokens(req: Request) -> int:
    params = req.sampling_params
    return params.max_tokens if params is not None and params.max_tokens else 1


@dataclass
class AdmissionCost:
    """The engine thread's time in admission: the steps some request waited to start, and the time building
    their views and asking the policy took (``status``'s ``admission_steps``, ``admission_mean_us``)."""

    steps: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.steps += 1
        self.seconds += seconds

    def summary(self) -> dict[str, str]:
        mean = f"{self.seconds / self.steps * 1e6:.0f}" if self.steps else "-"
        return {"admission_steps": str(self.steps), "admission_mean_us": mean}


class TetriDecodeScheduler(RoleScheduler):
    @classmethod
    def assume(cls, scheduler: Scheduler) -> TetriDecodeScheduler:
        """Make the engine's scheduler, whatever role it played, this one, with the engine's whole step budget
        (a flip, TetriInfer §3.5; on the engine thread, with the engine idle). vLLM's own state — queues, KV
        cache manager, connector — is untouched; the role's state starts afresh."""
        scheduler.__class__ = cls
        assert isinstance(scheduler, cls)
        config = scheduler.scheduler_config
        scheduler.max_num_scheduled_tokens = config.max_num_scheduled_tokens or config.max_num_batched_tokens
        scheduler._take_role()
        return scheduler

    def _take_role(self) -> None:
        self.planner = DecodePlanner()
        self._moving: dict[str, str] = {}  # req_id -> key its KV is parked under at its next slice boundary
        # requests preempted by recomputation: their KV instruction is spent, so they wait to be asked like any other
        self._recomputing: set[str] = set()
        # the worker's ids of requests preempted ("preempted") and back to decoding ("resumed"), told as they
        # happen (on the engine thread): the worker records them as the requests' states
        self.on_preemption: Callable[[str, str], None] | None = None
        self.admission_cost = AdmissionCost()

    def configure(
        self,
        policy: AdmissionPolicy,
        order: PreemptionOrder | None = None,
        strategy: PreemptionStrategy | None = None,
    ) -> None:
        self.planner.admission = policy
        self.planner.victim_order = order or self.planner.victim_order
        self.planner.strategy = strategy or self.planner.strategy

    @property
    def admission(self) -> AdmissionPolicy:
        return self.planner.admission

    @property
    def slice_iters(self) -> int:
        return self.planner.slice_iters

    @slice_iters.setter
    def slice_iters(self, value: int) -> None:
        self.planner.slice_iters = value

    @property
    def step_s(self) -> float:
        return self.planner.step_s

    @property
    def stats(self) -> PreemptionStats:
        return self.planner.stats

    @property
    def preemptions(self) -> int:
        return self.planner.stats.count

    def _view(
        self, req: Request, in_flight: set[str] | frozenset[str] = frozenset(), waiting: bool = False
    ) -> DecodeReqView:
        """``waiting``: a request about to start decoding, whose latest token came when it was preempted, or
        else when it came to this engine (the prefill's token, in disaggregated mode)."""
        tags = _tags(req)
        since = None
        if waiting:
            preempted = self.planner.preempted_at(req.request_id)
            since = preempted if preempted is not None else req.arrival_time
        return DecodeReqView(
            request_id=req.request_id,
            prompt_len=req.num_prompt_tokens,
            max_tokens=_max_tokens(req),
            arrival_time=req.arrival_time,
            generated=len(req.output_token_ids),
            estimate=tags.estimate,
            held_blocks=math.ceil(req.num_computed_tokens / self.block_size),
            tbt_slo_s=tags.tbt_slo_s,
            transferring=req.request_id in in_flight,
            waited_since=since,
        )

    def snapshot(self) -> DecodeSnapshot:
        """The state the worker reads (``EngineLoop``'s ``snapshot_fn``)."""
        running = tuple(self.running_views()) if self.slice_iters > 0 else ()
        step_s = self.step_s if self.running else 0.0
        decisions = decisions_of((self.planner.admission, self.planner.victim_order, self.planner.strategy))
        return DecodeSnapshot(
            self.remaining_tokens(), step_s, running, self.stats.summary(), decisions, self.admission_cost.summary()
        )

    def remaining_tokens(self) -> int:
        """Σ predicted tokens still to generate over running and queued requests. Published every
        ``SNAPSHOT_INTERVAL_S`` over every request the engine holds, so without building their views: built
        from views, the snapshot takes 3.3% of the engine thread's samples under the interpreter lock at
        saturation (``python benchmarks/diagnostics/engine_profile.py --scenario saturation``, measured on
        a07c4fc)."""
        return sum(
            predicted_remaining(_tags(r).estimate, _max_tokens(r), r.num_output_tokens, "estimate")
            for queue in (self.running, self.kv_holding_waiting, self.waiting)
            for r in queue
        )

    @staticmethod
    def _worker_id_of(req: Request) -> str:
        """The id the decode worker knows ``req`` by (vLLM suffixes its own ``request_id``)."""
        tags = _tags(req)
        return tags.request_id if tags.request_id is not None else str(req.request_id)

    def running_views(self) -> list[DecodeReqView]:
        """The running batch as the slice rebalancer sees it, by the worker's ids."""
        connector = self.connector
        in_flight = connector.in_flight() if _tracks_transfers(connector) else set()
        return [replace(self._view(r, in_flight), request_id=self._worker_id_of(r)) for r in list(self.running)]

    def retag(self, request_id: str, estimate: LengthEstimate) -> bool:
        """Give the worker's ``request_id`` a new length estimate (its prediction came after its handoff)."""
        return retag(self, request_id, estimate) is not None

    def mark_moving(self, request_id: str, key: str) -> None:
        """End the worker's ``request_id`` at its next slice boundary with its KV parked under ``key`` (SCLS §7)."""
        self._moving[request_id] = key

    def _cut_slices(self) -> None:
        """Cut every marked request the planner finds at a slice boundary this step: it generates this step's
        token and finishes (``length``), its KV parked by the connector. Not in a step that may preempt."""
        connector = self.connector
        if not self._moving or self.slice_iters <= 0 or not _parks_slices(connector):
            return
        live = {self._worker_id_of(r): r for r in self.requests.values() if not r.is_finished()}
        for rid in [rid for rid in self._moving if rid not in live]:  # finished or aborted meanwhile
            del self._moving[rid]
        if self._may_run_out():
            return
        progress = [
            SliceProgress(
                rid,
                req.num_output_tokens + 1,  # with this step's token
                req.num_computed_tokens == req.num_tokens - 1 and req in self.running,
                req.max_tokens,
            )
            for rid, req in ((rid, live[rid]) for rid in self._moving)
        ]
        for rid in self.planner.slice_cuts(progress):
            req = live[rid]
            req.max_tokens = req.num_output_tokens + 1
            connector.park_running(
                req, list(self.kv_cache_manager.get_block_ids(req.request_id)[0]), self._moving.pop(rid)
            )

    def _get_local_prefix_cache_hit(self, request: Request) -> tuple[KVCacheBlocks, int, int, bool]:
        """A request whose KV arrives through the connector loads all of it from there: the engine keeps prefix
        caching on for its prefill role (one engine, either role), and a local hit must not stand in for part
        of a transfer the connector loads whole."""
        kv = instruction_of(request.kv_transfer_params)
        if kv is not None and kv.mode is KVMode.RECV:
            return self.kv_cache_manager.empty_kv_cache_blocks, 0, 0, False
        return super()._get_local_prefix_cache_hit(request)

    def _must_pass(self, req: Request) -> bool:
        """A request whose KV has yet to be pulled through the connector (it needs its blocks first); not one
        preempted by recomputation, which has no KV to pull and recomputes it."""
        return (
            req.num_computed_tokens == 0
            and req.kv_transfer_params is not None
            and req.request_id not in self._recomputing
        )

    def _state(self, now: float) -> DecodeState:
        running = tuple(self._view(r) for r in self.running)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return DecodeState(free, self.block_size, running, now, self.step_s, self.planner.max_step_s)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        now = time.time()
        self.planner.observe_step(now, bool(self.running))
        held = self._gate(now)
        self._order_victims()
        self._cut_slices()
        try:
            out = super().schedule(throttle_prefills)
        finally:
            for queue, req in held:
                queue.add_request(req)
        if self.planner.preempted_ids:
            self._note_resumed(time.time())
        return out

    def _gate(self, now: float) -> list[tuple[RequestQueue, Request]]:
        """Put waiting requests to the planner's admission; remove and return the ones held back this step."""
        if self._recomputing:
            self._recomputing.intersection_update(self.requests)  # finished or aborted meanwhile
        candidates = {
            req.request_id: (queue, req)
            for queue in (self.kv_holding_waiting, self.waiting)
            for req in queue
            if not (self._must_pass(req) or self._is_blocked_waiting_status(req.status))
        }
        if not candidates:  # the common decode step: nobody waits to start, no views to build
            return []
        started = time.perf_counter()
        views = [self._view(req, waiting=True) for _, req in candidates.values()]
        decision = self.planner.admit(views, self._state(now))
        self.admission_cost.add(time.perf_counter() - started)
        held = [candidates[rid] for rid in decision.held]
        for queue, req in held:
            queue.remove_request(req)
        return held

    def _may_run_out(self) -> bool:
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return self.planner.may_run_out(
            [r.num_tokens - r.num_computed_tokens for r in self.running], free, self.block_size
        )

    def _order_victims(self) -> None:
        """Sort the running list so vLLM's tail-first preemption follows the planner's victim sequence (a no-op
        unless this step can run out of KV)."""
        if not self.planner.reorders(len(self.running)) or not self._may_run_out():
            return
        connector = self.connector
        in_flight = connector.in_flight() if _tracks_transfers(connector) else set()
        victims = self.planner.victims([self._view(r, in_flight) for r in self.running])
        by_id = {r.request_id: r for r in self.running}
        self.running[:] = [by_id[rid] for rid in reversed(victims)]

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        computed = min(request.num_computed_tokens, request.num_tokens - 1)
        connector = self.connector
        swapper = connector if _swaps(connector) else None
        if self.planner.preempted(request.request_id, computed, time.time(), swapper is not None) == "swap":
            assert swapper is not None  # the planner swaps only where the connector can
            block_ids = list(self.kv_cache_manager.get_block_ids(request.request_id)[0])
            swapper.swap_out(request, block_ids, computed)
            self._recomputing.discard(request.request_id)
        else:
            self._recomputing.add(request.request_id)
        super()._preempt_request(request, timestamp, drop_stale_output)
        if self.on_preemption is not None:
            self.on_preemption(self._worker_id_of(request), "preempted")

    def _note_resumed(self, now: float) -> None:
        """A preempted request is back once it is running with its KV restored (computed this step)."""
        computed: dict[str, int | None] = {}
        for rid in self.planner.preempted_ids:
            req = self.requests.get(rid)
            if req is not None:
                computed[rid] = req.num_computed_tokens if req in self.running else None
        back = self.planner.resumed(computed, now)
        if self.on_preemption is not None:
            for rid in back:
                req = self.requests.get(rid)
                if req is not None:
                    self.on_preemption(self._worker_id_of(req), "resumed")
