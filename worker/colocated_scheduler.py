"""The colocated engine's vLLM scheduler subclass: one engine, both phases, every paper's per-step decision.

A colocated worker's engine computes prompts and decodes in the same iterations (chunked prefill mixed into
decode batches, the engine SOLA, AccelGen, SCLS and CacheOpt schedule). Each ``schedule()`` call:

    1. the step's start goes to the decode planner's step-time estimate (``DecodePlanner.observe_step``)
    2. decode admission (``decode.admission``: greedy, reserve-*, cacheopt, sola, ...) is asked about every
       waiting request, prompts to compute included, in the policy's order; the ones it holds are taken out of
       vLLM's queues for this call (``TetriDecodeScheduler._gate``)
    3. the prefill planner (``prefill.queue_policy`` and ``prefill.chunking``) orders the prompts still to
       compute, the admitted waiting ones and the running ones part-way through, and cuts the iteration's
       budget into their chunks; vLLM is shown the decoding requests and the planned prompts in plan order,
       with a token budget of the plan's tokens plus one per decoding request (``PromptPlanning.expose``)
    4. when the batch may run out of KV, the running list is ordered so that vLLM, which preempts from its
       tail, preempts in the decode planner's victim sequence (``decode.preemption``)
    5. vLLM's own ``schedule()`` runs; the held requests go back; the iteration is measured for the prefill
       cost model's online correction (SOLA eq. 5)

What vLLM's scheduler cannot express, and how it is approximated here:

- **Decode tokens are never chunked or skipped by the plan.** vLLM schedules every running request before
  any waiting one; a running decode takes one token of the budget. The chunking policy's budget is for
  prompt tokens, and the step's budget is that plus one per decoding request, so a budget policy (AccelGen's
  S_b) bounds the prefill share of an iteration, not the decode share.
- **No decode request sits out an iteration by choice.** Neither phase-level ordering nor SOLA's workload
  bound on decode requests can leave a running decode out of a step: vLLM would have to preempt it. The
  policies bound what joins (admission) and the prompt tokens (the plan), which is the knob each paper turns
  on its own prefill side.
- **Preemption is vLLM's, at allocation failure**, from the tail of the running list; the victim order is
  carried by sorting that list (step 4), and swap-or-recompute by the decode planner's strategy. AccelGen's
  multi-resource selection adds its own (Alg. 1 lines 2–4): the batch member with the largest remaining time,
  prompt or decoding request, is preempted in step 3 when an urgent prompt's KV does not fit, through the same
  ``_preempt_request`` (so the decode planner's swap or recompute and its counters apply).
"""

from __future__ import annotations

import time
from dataclasses import replace

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput

from tetriserve.common.decisions import decisions_of
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.views import DecodeSnapshot
from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler
from tetriserve.prefill_worker.policy import PrefillPolicy
from tetriserve.prefill_worker.vllm_scheduler import PromptPlanning


class TetriColocatedScheduler(TetriDecodeScheduler):
    @classmethod
    def assume(cls, scheduler: Scheduler) -> TetriColocatedScheduler:
        """Make the engine's scheduler this one, with the engine's whole step budget (on the engine thread,
        with the engine idle); vLLM's own state is untouched."""
        scheduler.__class__ = cls
        assert isinstance(scheduler, cls)
        config = scheduler.scheduler_config
        scheduler.max_num_scheduled_tokens = config.max_num_scheduled_tokens or config.max_num_batched_tokens
        scheduler._take_role()
        return scheduler

    def _take_role(self) -> None:
        super()._take_role()
        self.prompts = PromptPlanning(self.max_num_scheduled_tokens)

    def configure_prompts(self, policy: PrefillPolicy) -> None:
        """The prefill side's queue order and chunking (on the engine thread, between steps)."""
        self.prompts.planner.policy = policy

    def retag(self, request_id: str, estimate: LengthEstimate) -> bool:
        """A late length prediction: the decode side's tags and the prompt side's view (AccelGen's S_g) take
        it."""
        return self.prompts.retag(self, request_id, estimate)

    def snapshot(self) -> DecodeSnapshot:
        snap = super().snapshot()
        prompt_policy = self.prompts.planner.policy
        mine = decisions_of((prompt_policy.queue, prompt_policy.chunking))
        return replace(snap, decisions={**snap.decisions, **mine})

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        t0 = time.perf_counter()
        now = time.time()
        self.planner.observe_step(now, bool(self.running))
        held = self._gate(now)
        exposed = self.prompts.expose(self, now)
        self._order_victims()
        overhead = time.perf_counter() - t0
        try:
            out = Scheduler.schedule(self, throttle_prefills)
        finally:
            t1 = time.perf_counter()
            self.prompts.restore(self, exposed)
            for queue, req in held:
                queue.add_request(req)
        self.prompts.scheduled(out, exposed, now, overhead + time.perf_counter() - t1)
        if self.planner.preempted_ids:
            self._note_resumed(time.time())
        return out

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        self.prompts.finished(scheduler_output, self.requests)
        return super().update_from_output(scheduler_output, model_runner_output)
