"""The prefill engine's vLLM scheduler subclass (``scheduler_cls``): the planner decides, vLLM executes.

Each ``schedule()`` call:

    1. build a ReqView per prompt still to prefill (vLLM's running + waiting queues;
       arrival and SLOs come as ``EngineTags`` in ``SamplingParams.extra_args``)
    2. ``PrefillPlanner.plan`` orders them (the queue policy) and cuts the token budget into chunks
       (the chunking policy), from the views, the KV pool and the time read here
    3. expose to vLLM exactly the planned requests, in plan order (the others are
       held aside for this call), with ``max_num_scheduled_tokens`` = the plan's tokens;
       vLLM serves running requests first, then waiting ones, each taking
       min(remaining, budget left), which reproduces the plan chunk for chunk
    4. ``super().schedule()``, then put the held-aside requests back

With AccelGen's multi-resource selection the plan may name batch members to preempt for an urgent request
(Alg. 1 lines 2–4): they are taken off the running list and preempted through vLLM's own
``_preempt_request`` (their KV freed, recomputed later) before the planned requests are exposed.

The plan assumes a waiting prompt starts from zero; when vLLM finds a prefix
of it in its cache it computes less, and the rest of the budget flows to the
next planned request.

``update_from_output`` measures the iteration (end of ``schedule`` → start of
``update_from_output``), hands it to the planner (SOLA's online correction, eq. 5)
and appends an ``IterationRecord``. Requests that are already decoding (colocated
use) are left to vLLM untouched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from tetriserve.common.engine_tags import tags_of
from tetriserve.common.iteration_log import IterationLog, IterationRecord
from tetriserve.common.length import LengthEstimate
from tetriserve.common.sola_state import Observed
from tetriserve.engine.role_scheduler import RoleScheduler, retag
from tetriserve.prefill_worker.planner import KVPool, PrefillPlanner
from tetriserve.prefill_worker.policy import PrefillPolicy
from tetriserve.prefill_worker.views import ReqView


@dataclass(frozen=True)
class _Pending:
    """An iteration scheduled but not yet finished."""

    started: float
    overhead_s: float
    budget: int
    chunks: tuple[tuple[str, int, int], ...]
    predicted_s: float | None
    exec_start: float
    work: tuple[tuple[int, int], ...]  # (computed, tokens) of each chunk: what the cost model prices


@dataclass(frozen=True)
class _Exposed:
    """What one ``schedule()`` call held aside from vLLM, and what the planned requests had computed."""

    held_running: list[Request]
    held_waiting: list[Request]
    computed: dict[str, int]
    budget: int


class PromptPlanning:
    """The prefill half of a vLLM scheduler's step, through a ``PrefillPlanner``: expose the planned prompts in
    plan order with the plan's token budget (``expose``), put the rest back (``restore``), and measure the
    iteration for the cost model and the iteration log (``scheduled``, ``finished``). The prefill role's
    scheduler uses it alone; the colocated engine's (``worker/colocated_scheduler.py``) beside the decode
    planner's admission and preemption. Requests already decoding are left to vLLM, each counted one token of
    the budget."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.planner = PrefillPlanner.fixed(ceiling)
        self.log = IterationLog()
        self._pending: _Pending | None = None
        self._ext: dict[str, str] = {}  # vLLM's request id -> ours
        self._views: dict[str, ReqView] = {}

    def _view(self, req: Request) -> ReqView:
        """The request's view, rebuilt only when its progress changed since the last iteration."""
        cached = self._views.get(req.request_id)
        if cached is not None and cached.computed_tokens == req.num_computed_tokens:
            return cached
        view = self._build_view(req)
        self._views[req.request_id] = view
        return view

    def _build_view(self, req: Request) -> ReqView:
        params = req.sampling_params
        tags = tags_of(params.extra_args if params is not None else None)
        arrival = tags.arrival if tags.arrival is not None else float(req.arrival_time)
        if tags.request_id is not None:
            self._ext[req.request_id] = tags.request_id  # vLLM suffixes request ids; records use ours
        engine_max = params.max_tokens if params is not None and params.max_tokens else 1
        return ReqView(
            request_id=req.request_id,
            prompt_len=req.num_prompt_tokens,
            # S_g reads the client's cap where the engine runs the request for fewer (the prefill role: one token)
            max_tokens=tags.max_tokens if tags.max_tokens is not None else engine_max,
            arrival_time=arrival,
            estimate=tags.estimate,
            priority=tags.priority,
            computed_tokens=req.num_computed_tokens,
            ttft_slo_s=tags.ttft_slo_s,
            jct_slo_s=tags.jct_slo_s,
            tbt_slo_s=tags.tbt_slo_s,
            queued_since=self.planner.queued_since(req.request_id, arrival),
            batch_seq=tags.batch_seq,
        )

    def retag(self, sched: Scheduler, request_id: str, estimate: LengthEstimate) -> bool:
        """Give the worker's ``request_id`` a new length estimate (its prediction came while it is in the
        engine); its view is rebuilt with it at the next iteration."""
        engine_id = retag(sched, request_id, estimate)
        if engine_id is not None:
            self._views.pop(engine_id, None)
        return engine_id is not None

    def _preempt(self, sched: Scheduler, victims: tuple[str, ...]) -> None:
        """AccelGen Alg. 1 lines 2–4: the planned victims give up their KV through vLLM's own preemption (the
        scheduler's ``_preempt_request``: a colocated engine's goes through the decode planner's swap or
        recompute); a victim vLLM no longer runs is passed over."""
        running = {r.request_id: r for r in sched.running}
        now = time.time()
        for rid in victims:
            req = running.get(rid)
            if req is None:
                continue
            sched.running.remove(req)
            sched._preempt_request(req, now, drop_stale_output=sched.requires_kv_delivery)

    def _observed(self, req: Request) -> Observed:
        """A decoding request as SOLA's state monitor reads it (its arrival on the clock of the views')."""
        params = req.sampling_params
        tags = tags_of(params.extra_args if params is not None else None)
        arrival = tags.arrival if tags.arrival is not None else float(req.arrival_time)
        return Observed(
            req.request_id,
            arrival,
            req.num_prompt_tokens,
            params.max_tokens if params is not None and params.max_tokens else 1,
            req.num_output_tokens,
            tags.ttft_slo_s,
            tags.tbt_slo_s,
            tags.estimate.estimate if tags.estimate is not None else None,
        )

    def expose(self, sched: Scheduler, started: float) -> _Exposed:
        """Leave in ``sched``'s queues the decoding requests and the planned prompts, in plan order, with
        ``max_num_scheduled_tokens`` = the plan's tokens + one per decoding request."""
        decoding = [r for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens]
        prefilling = [r for r in sched.running if r.num_computed_tokens < r.num_prompt_tokens]
        waiting = list(sched.waiting)
        by_id = {r.request_id: r for r in (*prefilling, *waiting)}
        blocks = sched.kv_cache_manager.block_pool
        pool = KVPool(self.ceiling, sched.block_size, blocks.get_num_free_blocks(), blocks.num_gpu_blocks)
        batch = [self._build_view(r) for r in decoding] if self.planner.preempts else []
        reads = getattr(self.planner.policy.chunking, "reads_decoding", False)  # SOLA's state monitor
        seen = [self._observed(r) for r in decoding] if reads else []
        plan = self.planner.plan([self._view(r) for r in by_id.values()], pool, started, batch, seen)
        if plan.preempt:  # Alg. 1: the victims leave the running list for the waiting queue
            self._preempt(sched, plan.preempt)
            decoding = [r for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens]
            prefilling = [r for r in sched.running if r.num_computed_tokens < r.num_prompt_tokens]
            waiting = list(sched.waiting)
        planned = [by_id[c.request_id] for c in plan.chunks]
        planned_ids = {c.request_id for c in plan.chunks}
        running_ids = {r.request_id for r in prefilling}
        held_running = [r for r in prefilling if r.request_id not in planned_ids]
        held_waiting = [r for r in waiting if r.request_id not in planned_ids]
        computed = {r.request_id: r.num_computed_tokens for r in (*decoding, *planned)}  # vLLM advances it
        sched.running[:] = decoding + [r for r in planned if r.request_id in running_ids]
        sched.waiting.remove_requests(waiting)
        for r in planned:
            if r.request_id not in running_ids:
                sched.waiting.add_request(r)
        sched.max_num_scheduled_tokens = max(1, min(self.ceiling, plan.tokens + len(decoding)))
        return _Exposed(held_running, held_waiting, computed, plan.budget)

    def restore(self, sched: Scheduler, exposed: _Exposed) -> None:
        sched.running.extend(exposed.held_running)
        for r in exposed.held_waiting:
            sched.waiting.add_request(r)
        sched.max_num_scheduled_tokens = self.ceiling

    def scheduled(self, out: SchedulerOutput, exposed: _Exposed, started: float, overhead_s: float) -> None:
        """The step vLLM scheduled from the exposed queues: what the cost model prices, timed from now."""
        comp = tuple(
            (self._ext.get(rid, rid), exposed.computed.get(rid, 0), n) for rid, n in out.num_scheduled_tokens.items()
        )
        work = tuple((h, n) for _, h, n in comp)
        predicted = self.planner.predicted_s(work)
        self._pending = _Pending(started, overhead_s, exposed.budget, comp, predicted, time.perf_counter(), work)

    def finished(self, scheduler_output: SchedulerOutput, requests: Mapping[str, Request]) -> None:
        """The step's model run is over: the planner corrects its cost model (SOLA eq. 5) and the iteration is
        logged; what is kept of requests no longer in ``requests`` is dropped now and then."""
        p, self._pending = self._pending, None
        if p is not None and scheduler_output.total_num_scheduled_tokens > 0:
            exec_s = time.perf_counter() - p.exec_start
            self.planner.observe(p.work, exec_s, scheduler_output.num_scheduled_tokens, time.time())
            cost = self.planner.policy.cost
            if cost is not None:
                self.log.gamma = cost.prefill_gamma.gamma
            self.log.add(IterationRecord(p.started, p.budget, p.chunks, p.overhead_s, exec_s, p.predicted_s))
        if max(self.planner.remembered, len(self._views)) > 2 * len(requests) + 64:  # drop finished ones
            self.planner.forget(set(requests))
            self._ext = {k: v for k, v in self._ext.items() if k in requests}
            self._views = {k: v for k, v in self._views.items() if k in requests}


class TetriPrefillScheduler(RoleScheduler):
    @classmethod
    def assume(cls, scheduler: Scheduler, ceiling: int) -> TetriPrefillScheduler:
        """Make the engine's scheduler, whatever role it played, this one, with at most ``ceiling`` tokens a
        step (a flip, TetriInfer §3.5; on the engine thread, with the engine idle). vLLM's own state —
        queues, KV cache manager, connector — is untouched; the role's state starts afresh."""
        scheduler.__class__ = cls
        assert isinstance(scheduler, cls)
        scheduler._take_role(ceiling)
        return scheduler

    def _take_role(self, ceiling: int | None = None) -> None:
        """``ceiling``: at most that many tokens a step (None: the engine's step budget)."""
        self.ceiling = self.max_num_scheduled_tokens = self.max_num_scheduled_tokens if ceiling is None else ceiling
        self.prompts = PromptPlanning(self.ceiling)

    @property
    def planner(self) -> PrefillPlanner:
        return self.prompts.planner

    @property
    def log(self) -> IterationLog:
        return self.prompts.log

    def configure(self, policy: PrefillPolicy) -> None:
        """Swap the policy; takes effect at the next iteration (called on the engine thread, between steps)."""
        self.planner.policy = policy

    def retag(self, request_id: str, estimate: LengthEstimate) -> bool:
        """Give the worker's ``request_id`` a new length estimate (its prediction came while it is computed)."""
        return self.prompts.retag(self, request_id, estimate)

    @property
    def prefill_policy(self) -> PrefillPolicy:
        """The role's policy (vLLM's own ``policy`` attribute, its queue discipline, is left as it is)."""
        return self.planner.policy

    # -- vLLM hooks ------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        t0 = time.perf_counter()
        started = time.time()
        exposed = self.prompts.expose(self, started)
        overhead = time.perf_counter() - t0
        try:
            out = super().schedule(throttle_prefills)
        finally:
            t1 = time.perf_counter()
            self.prompts.restore(self, exposed)
        self.prompts.scheduled(out, exposed, started, overhead + time.perf_counter() - t1)
        return out

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        self.prompts.finished(scheduler_output, self.requests)  # before vLLM drops the finished requests
        return super().update_from_output(scheduler_output, model_runner_output)
