"""The decode engine's vLLM scheduler subclass (``scheduler_cls``): admission, preemption order, swap.

Each ``schedule()`` call:

    1. views of the running batch (context, tokens generated, the predicted length range and the
       TBT SLO from the ``EngineTags`` in ``SamplingParams.extra_args``)
       and the KV that is free
    2. every waiting request that would *start decoding* now is put to the admission policy,
       in the policy's order (arrival unless it says otherwise), each admitted one folded into
       the state before the next is asked; the first refusal stops admission for this step.
       A request whose KV has yet to come through the connector is not asked (below): when its
       KV has already landed and is small enough to load within the step
       (``transport.sync_load_mib``), it starts decoding in that same step, unasked
    3. refused requests are held aside for this one call
    4. when the batch may run out of KV this step (fewer free blocks than running requests),
       the running list is sorted so that vLLM, which preempts from its tail, preempts in the
       preemption order's sequence (CacheOpt §3.4); then ``super().schedule()``

    5. SCLS slices (§7): a request the worker has marked to move (``mark_moving``) ends at its
       next slice boundary, when it has generated a multiple of ``slice_iters`` tokens here: its
       ``max_tokens`` is cut to this step's token and the connector parks its KV, which the
       worker ships to the destination when the engine reports the request finished (``length``)

Only the engine thread calls into this class (the engine has one owner:
``docs/design/ownership.md``): the worker changes policies and marks slice moves
through ``EngineLoop.call`` and reads the frozen ``DecodeSnapshot`` the engine
thread publishes (``snapshot``).

A request that still has to pull its KV through the connector (no blocks yet) is
never held: it must get its blocks so its KV can land; it is gated once its KV
is in, holding those blocks. A request swapped out (CacheOpt §3.5) comes back the
same way. Every preemption is counted and timed until the request decodes again.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from tetriserve.common.engine_tags import TAGS_KEY, EngineTags, tags_of
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import AdmissionPolicy, make_admission_policy
from tetriserve.decode_worker.preemption import PreemptionOrder, PreemptionStrategy, make_preemption_order
from tetriserve.decode_worker.preemption.stats import PreemptionStats
from tetriserve.decode_worker.views import DecodeReqView, DecodeSnapshot, DecodeState, predicted_remaining
from tetriserve.transport.instructions import KVMode, instruction_of

STEP_SMOOTHING = 0.2


def _tags(req: Any) -> EngineTags:
    """The tetriserve tags a vLLM request carries (``NO_TAGS`` for one without)."""
    params = req.sampling_params
    return tags_of(params.extra_args if params is not None else None)


def _max_tokens(req: Any) -> int:
    params = req.sampling_params
    return params.max_tokens if params is not None and params.max_tokens else 1


class TetriDecodeScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._take_role()

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
        self.admission: AdmissionPolicy = make_admission_policy("greedy")
        self.victim_order: PreemptionOrder = make_preemption_order("vllm")
        self.strategy = PreemptionStrategy("recompute")
        self.stats = PreemptionStats()
        self._out: dict[str, tuple[float, int]] = {}  # preempted req_id -> (when, tokens it had computed)
        self._last_call = 0.0
        self.step_s = 0.0
        self.slice_iters = 0
        self._moving: dict[str, str] = {}  # req_id -> key its KV is parked under at its next slice boundary

    def configure(
        self,
        policy: AdmissionPolicy,
        order: PreemptionOrder | None = None,
        strategy: PreemptionStrategy | None = None,
    ) -> None:
        self.admission = policy
        self.victim_order = order or self.victim_order
        self.strategy = strategy or self.strategy

    @property
    def preemptions(self) -> int:
        return self.stats.count

    def _view(self, req: Any, in_flight: set[str] | frozenset[str] = frozenset()) -> DecodeReqView:
        tags = _tags(req)
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
        )

    def snapshot(self) -> DecodeSnapshot:
        """The state the worker reads (``EngineLoop``'s ``snapshot_fn``)."""
        running = tuple(self.running_views()) if self.slice_iters > 0 else ()
        step_s = self.step_s if self.running else 0.0
        return DecodeSnapshot(self.remaining_tokens(), step_s, running, self.stats.summary())

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
    def _worker_id_of(req: Any) -> str:
        """The id the decode worker knows ``req`` by (vLLM suffixes its own ``request_id``)."""
        tags = _tags(req)
        return tags.request_id if tags.request_id is not None else str(req.request_id)

    def running_views(self) -> list[DecodeReqView]:
        """The running batch as the slice rebalancer sees it, by the worker's ids."""
        in_flight = self.connector.in_flight() if hasattr(self.connector, "in_flight") else set()
        return [replace(self._view(r, in_flight), request_id=self._worker_id_of(r)) for r in list(self.running)]

    def retag(self, request_id: str, estimate: LengthEstimate) -> bool:
        """Give the worker's ``request_id`` a new length estimate (its prediction came after its handoff)."""
        for req in self.requests.values():
            params = req.sampling_params
            tags = tags_of(params.extra_args if params is not None else None)
            if tags.request_id == request_id:
                params.extra_args[TAGS_KEY] = replace(tags, estimate=estimate)
                return True
        return False

    def mark_moving(self, request_id: str, key: str) -> None:
        """End the worker's ``request_id`` at its next slice boundary with its KV parked under ``key`` (SCLS §7)."""
        self._moving[request_id] = key

    def _cut_slices(self) -> None:
        """Cut every marked request that is at a slice boundary this step: it generates this step's token
        and finishes (``length``), its KV parked by the connector. Not in a step that may preempt."""
        if not self._moving or self.slice_iters <= 0 or not hasattr(self.connector, "park_running"):
            return
        live = {self._worker_id_of(r): r for r in self.requests.values() if not r.is_finished()}
        for rid in [rid for rid in self._moving if rid not in live]:  # finished or aborted meanwhile
            del self._moving[rid]
        if self._may_run_out():
            return
        for rid, key in list(self._moving.items()):
            req = live[rid]
            produced = req.num_output_tokens + 1  # with this step's token
            decoding = req.num_computed_tokens == req.num_tokens - 1 and req in self.running
            if not decoding or produced % self.slice_iters or produced >= req.max_tokens:
                continue
            req.max_tokens = produced
            self.connector.park_running(req, list(self.kv_cache_manager.get_block_ids(req.request_id)[0]), key)
            del self._moving[rid]

    def _get_local_prefix_cache_hit(self, request: Any) -> Any:
        """A request whose KV arrives through the connector loads all of it from there: the engine keeps prefix
        caching on for its prefill role (one engine, either role), and a local hit must not stand in for part
        of a transfer the connector loads whole."""
        kv = instruction_of(request.kv_transfer_params)
        if kv is not None and kv.mode is KVMode.RECV:
            return self.kv_cache_manager.empty_kv_cache_blocks, 0, 0, False
        return super()._get_local_prefix_cache_hit(request)

    def _must_pass(self, req: Any) -> bool:
        """A request whose KV has yet to be pulled through the connector (it needs its blocks first)."""
        return req.num_computed_tokens == 0 and req.kv_transfer_params is not None

    def _state(self, now: float) -> DecodeState:
        running = tuple(self._view(r) for r in self.running)
        return DecodeState(
            self.kv_cache_manager.block_pool.get_num_free_blocks(), self.block_size, running, now, self.step_s
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = time.time()
        if self._last_call and self.running:
            gap = now - self._last_call
            self.step_s = gap if not self.step_s else (1 - STEP_SMOOTHING) * self.step_s + STEP_SMOOTHING * gap
        self._last_call = now
        held = self._gate(now)
        self._order_victims()
        self._cut_slices()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            for queue, req in held:
                queue.add_request(req)
        if self._out:
            self._note_resumed(time.time())
        return out

    def _gate(self, now: float) -> list[tuple[Any, Any]]:
        """Put waiting requests to the admission policy; remove and return the ones held back this step."""
        candidates = {
            req.request_id: (queue, req)
            for queue in (self.kv_holding_waiting, self.waiting)
            for req in queue
            if not (self._must_pass(req) or self._is_blocked_waiting_status(req.status))
        }
        if not candidates:  # the common decode step: nobody waits to start, no views to build
            return []
        policy = self.admission
        state = self._state(now)
        held: list[tuple[Any, Any]] = []  # (queue, request): refused, or behind a refusal
        for view in policy.order([self._view(req) for _, req in candidates.values()], state):
            if not held and policy.admit(view, state):
                state = state.with_admitted(view)
            else:
                held.append(candidates[view.request_id])
        for queue, req in held:
            queue.remove_request(req)
        return held

    def _may_run_out(self) -> bool:
        """Whether this step's allocations could exceed the free blocks: a decoding request needs at most one
        new block, one still prefilling (e.g. recomputing after a preemption) at most its remaining tokens'."""
        need = 0
        for r in self.running:
            left = r.num_tokens - r.num_computed_tokens
            need += 1 if left <= 1 else math.ceil(left / self.block_size) + 1
        return need > self.kv_cache_manager.block_pool.get_num_free_blocks()

    def _order_victims(self) -> None:
        """Sort the running list so vLLM's tail-first preemption follows ``victim_order`` (a no-op unless
        this step can run out of KV)."""
        if self.victim_order.name == "vllm" or len(self.running) < 2 or not self._may_run_out():
            return
        in_flight = self.connector.in_flight() if hasattr(self.connector, "in_flight") else set()
        by_id = {r.request_id: r for r in self.running}
        victims = self.victim_order.victims([self._view(r, in_flight) for r in self.running])
        self.running[:] = [by_id[v.request_id] for v in reversed(victims)]

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self.stats.count += 1
        computed = min(request.num_computed_tokens, request.num_tokens - 1)
        if self.strategy.choose(computed) == "swap" and computed > 0 and hasattr(self.connector, "swap_out"):
            block_ids = list(self.kv_cache_manager.get_block_ids(request.request_id)[0])
            self.connector.swap_out(request, block_ids, computed)
            self.stats.swapped += 1
        else:
            self.stats.recomputed += 1
        self._out[request.request_id] = (time.time(), computed)
        super()._preempt_request(request, *args, **kwargs)

    def _note_resumed(self, now: float) -> None:
        """A preempted request is back once it is running with its KV restored (computed this step)."""
        durations = self.stats.durations_s
        for rid, (since, tokens) in list(self._out.items()):
            req = self.requests.get(rid)
            if req is None:  # finished or aborted while out
                del self._out[rid]
            elif req in self.running and req.num_computed_tokens >= tokens:
                durations.append(now - since)
                del self._out[rid]
