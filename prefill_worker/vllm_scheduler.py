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
from dataclasses import dataclass

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from tetriserve.common.engine_tags import tags_of
from tetriserve.common.iteration_log import IterationLog, IterationRecord
from tetriserve.engine.role_scheduler import RoleScheduler
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
        self.planner = PrefillPlanner.fixed(self.ceiling)
        self.log = IterationLog()
        self._pending: _Pending | None = None
        self._ext: dict[str, str] = {}  # vLLM's request id -> ours
        self._views: dict[str, ReqView] = {}

    def configure(self, policy: PrefillPolicy) -> None:
        """Swap the policy; takes effect at the next iteration (called on the engine thread, between steps)."""
        self.planner.policy = policy

    @property
    def prefill_policy(self) -> PrefillPolicy:
        """The role's policy (vLLM's own ``policy`` attribute, its queue discipline, is left as it is)."""
        return self.planner.policy

    # -- views ---------------------------------------------------------------------------
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
        return ReqView(
            request_id=req.request_id,
            prompt_len=req.num_prompt_tokens,
            max_tokens=params.max_tokens if params is not None and params.max_tokens else 1,
            arrival_time=arrival,
            priority=tags.priority,
            computed_tokens=req.num_computed_tokens,
            ttft_slo_s=tags.ttft_slo_s,
            jct_slo_s=tags.jct_slo_s,
            queued_since=self.planner.queued_since(req.request_id, arrival),
            batch_seq=tags.batch_seq,
        )

    # -- vLLM hooks ------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        t0 = time.perf_counter()
        started = time.time()
        decoding = [r for r in self.running if r.num_computed_tokens >= r.num_prompt_tokens]
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        waiting = list(self.waiting)
        by_id = {r.request_id: r for r in (*prefilling, *waiting)}
        pool = KVPool(self.ceiling, self.block_size, self.kv_cache_manager.block_pool.get_num_free_blocks())
        plan = self.planner.plan([self._view(r) for r in by_id.values()], pool, started)
        tokens = plan.tokens
        planned = [by_id[c.request_id] for c in plan.chunks]
        planned_ids = {c.request_id for c in plan.chunks}
        running_ids = {r.request_id for r in prefilling}
        held_running = [r for r in prefilling if r.request_id not in planned_ids]
        held_waiting = [r for r in waiting if r.request_id not in planned_ids]
        computed = {r.request_id: r.num_computed_tokens for r in (*decoding, *planned)}  # vLLM advances it
        self.running[:] = decoding + [r for r in planned if r.request_id in running_ids]
        self.waiting.remove_requests(waiting)
        for r in planned:
            if r.request_id not in running_ids:
                self.waiting.add_request(r)
        self.max_num_scheduled_tokens = max(1, min(self.ceiling, tokens + len(decoding)))
        overhead = time.perf_counter() - t0
        try:
            out = super().schedule(throttle_prefills)
        finally:
            t1 = time.perf_counter()
            self.running.extend(held_running)
            for r in held_waiting:
                self.waiting.add_request(r)
            self.max_num_scheduled_tokens = self.ceiling
        comp = tuple((self._ext.get(rid, rid), computed.get(rid, 0), n) for rid, n in out.num_scheduled_tokens.items())
        work = tuple((h, n) for _, h, n in comp)
        predicted = self.planner.predicted_s(work)
        overhead += time.perf_counter() - t1
        self._pending = _Pending(started, overhead, plan.budget, comp, predicted, time.perf_counter(), work)
        return out

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        p, self._pending = self._pending, None
        if p is not None and scheduler_output.total_num_scheduled_tokens > 0:
            exec_s = time.perf_counter() - p.exec_start
            self.planner.observe(p.work, exec_s, scheduler_output.num_scheduled_tokens, time.time())
            if self.prefill_policy.cost is not None:
                self.log.gamma = self.prefill_policy.cost.prefill_gamma.gamma
            self.log.add(IterationRecord(p.started, p.budget, p.chunks, p.overhead_s, exec_s, p.predicted_s))
        result = super().update_from_output(scheduler_output, model_runner_output)
        if max(self.planner.remembered, len(self._views)) > 2 * len(self.requests) + 64:  # drop finished ones
            self.planner.forget(set(self.requests))
            self._ext = {k: v for k, v in self._ext.items() if k in self.requests}
            self._views = {k: v for k, v in self._views.items() if k in self.requests}
        return result
