"""ColocatedWorker: one engine that runs both phases of every request placed on it (``mode: colocated``).

    front door ──submit (intake)──▶ ColocatedWorker ──▶ its engine: the prompt in chunks, mixed into the decode
                                         │               batches of the requests already generating, then every
                                         │               token to the end
                                         ▼
    engine deltas ─▶ the front door's stream from this worker, as a decode worker's

This is the engine SOLA, AccelGen, SCLS and CacheOpt schedule: their per-iteration decisions run on it through
``worker/colocated_scheduler.py`` — the prefill section's queue order and chunking (which prompts compute how
many tokens this iteration) and the decode section's admission and preemption (which waiting requests join the
batch, which running one gives up its KV). It is a decode worker (streams, aborts, preemption accounting,
migration of its requests on failure) that takes its requests from the front doors' intake, like a prefill
worker, and computes their prompts itself; no KV moves between workers.

The length estimate: a request starts at once with the predictor's ``instant`` estimate, and the configured
predictor's own estimate, computed on the worker's prediction thread (``prefill_worker/predictions.py``),
replaces it as soon as it is out (``refine``), so no request waits for the predictor; with
``prefill.predictor_queue_wait_ms`` a request first waits up to that long for the prediction.

The control plane places requests on colocated workers as it does on prefill workers: each reports a
``PrefillLoad`` (its prompts not yet at their first token, and their tokens). It reports no queue wait of its
own (``queue_wait_s`` 0): the GlobalScheduler's per-worker bound (``admission.max_queued_per_worker``) and the
front doors' admission (``admission.max_wait_s``, from the measured start rate) shed the overload. Colocated
workers never flip (they have no other role); SCLS slice moves between them are not made (the cluster monitor
rebalances decode workers only).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tetriserve.common.config import ClusterConfig, DecodeConfig
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.length import LengthPredictor, PredictInput
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason, TokenLogprobs
from tetriserve.decode_worker.role import snapshot_of
from tetriserve.decode_worker.worker import DecodeWorker, Running
from tetriserve.engine.hardware import detect_hardware
from tetriserve.observability import tracing
from tetriserve.prefill_worker.policy import (
    AccelGenParams,
    PrefillPolicy,
    PrefillPolicySpec,
    build_prefill_policy,
    load_cost,
    spec_from_config,
)
from tetriserve.prefill_worker.predictions import PredictionQueue, Ticket

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)

PROMPT_KEYS = frozenset(PrefillPolicySpec.__dataclass_fields__)  # set_policy keys of the prefill side


class ColocatedWorker(DecodeWorker):
    def __init__(
        self,
        worker_id: str,
        config: ClusterConfig,
        model_path: str,
        predictor: LengthPredictor,
        incarnation: int = 0,
    ) -> None:
        self.cost = load_cost(config.prefill, model_path, detect_hardware())
        self.prompt_policy: PrefillPolicy = build_prefill_policy(
            spec_from_config(config.prefill), self.cost, AccelGenParams.from_config(config.prefill)
        )
        super().__init__(worker_id, config, model_path, incarnation, None)
        self.predictor = predictor
        self.predictions = PredictionQueue(predictor, niceness=config.prefill.predictor_niceness)
        self._tickets: dict[str, Ticket] = {}  # request id -> its prediction, until it is out or the request ends

    def _decode_cost(self, config: ClusterConfig, model_path: str) -> CostEstimator | None:
        """The prompt side's cost models: one engine, one estimator, eq. 3 and eq. 4 each with its γ."""
        return self.cost

    def _first_installer(self, cfg: DecodeConfig) -> Callable[[Scheduler], None]:
        install = self._installer(cfg)
        policy = self.prompt_policy

        def assume(scheduler: Scheduler) -> None:
            from tetriserve.worker.colocated_scheduler import TetriColocatedScheduler

            colocated = TetriColocatedScheduler.assume(scheduler)
            colocated.configure_prompts(policy)
            colocated.on_preemption = self.preemption_seen
            install(colocated)

        return assume

    # -- the request path -------------------------------------------------------------
    def submit(self, req: Request, subscriber: str) -> None:
        """Take ``req`` from a front door: its prompt (and, for a migrated request, the tokens the client has)
        is computed here and it decodes here to its end."""
        if not self._may_take(req):
            error = f"{self.worker_id} is not taking requests" if not self.accepting else "an attempt is here"
            self.publish(subscriber, req, (), FinishReason.ERROR, error, index=len(req.resume), retry=True)
            return
        item = PredictInput(len(req.prompt_token_ids), req.sampling.max_tokens, tuple(req.prompt_token_ids))
        req.length_estimate = self.predictor.instant(item)  # the prediction replaces it when out (``refine``)
        run = self._track(req, subscriber, list(req.resume), tracing.now_ns())
        self.event(req.request_id, RequestState.PREFILLING, self.worker_id, estimate=req.length_estimate)
        ticket = self._tickets[req.request_id] = self.predictions.submit(item)
        wait_s = self.config.prefill.predictor_queue_wait_ms / 1000
        if wait_s > 0:  # an abort cancels the wait (``run.task``) and ends the stream
            run.task = asyncio.get_running_loop().create_task(self._start_on_prediction(run, ticket, wait_s))
        else:
            self._start(run, None)  # None: no KV comes, the engine computes the prompt
        asyncio.get_running_loop().create_task(self._refine_when_out(req, ticket))

    async def _start_on_prediction(self, run: Running, ticket: Ticket, wait_s: float) -> None:
        """Start ``run`` once its prediction is out, or after ``wait_s`` (``prefill.predictor_queue_wait_ms``) on
        the instant estimate."""
        if (estimate := await self.predictions.within(ticket, wait_s)) is not None:
            self._estimated(run, estimate)
        self._start(run, None)

    async def _refine_when_out(self, req: Request, ticket: Ticket) -> None:
        estimate = await self.predictions.later(ticket.future)
        if self._tickets.get(req.request_id) is ticket:
            del self._tickets[req.request_id]
        if estimate is not None:
            await self.refine(req.request_id, req.attempt, estimate)

    def _publish(
        self,
        run: Running,
        tokens: tuple[int, ...],
        reason: FinishReason | None = None,
        error: str | None = None,
        *,
        index: int,
        moved_to: str | None = None,
        retry: bool = False,
        logprobs: tuple[TokenLogprobs, ...] | None = None,
    ) -> None:
        super()._publish(run, tokens, reason, error, index=index, moved_to=moved_to, retry=retry, logprobs=logprobs)
        if reason is not None and (ticket := self._tickets.pop(run.request.request_id, None)) is not None:
            self.predictions.withdraw(ticket)  # over before its prediction: never computed

    # -- what the control plane reads --------------------------------------------------
    def load(self) -> PrefillLoad:
        """Placed on like a prefill worker: queued = its prompts not yet at their first token."""
        prompts = [r for r in self.running.values() if r.computing_prompt]
        return PrefillLoad(
            self.worker_id,
            len(prompts),
            len(self.running) - len(prompts),
            sum(len(r.request.prompt_token_ids) + r.base for r in prompts),
            time.time(),
            self.incarnation,
            self.engine.steps,
            self.engine.in_flight > 0,
            total_kv_blocks=self.engine.snapshot.stats.total_blocks,
        )

    def policies(self) -> dict[str, str]:
        return {
            **self.prompt_policy.spec.describe(),
            **super().policies(),
            "predictor": self.predictor.name,
            "predictor_state": self.predictions.state.value,
        }

    def decisions(self) -> dict[str, dict[str, int]]:
        snap = snapshot_of(self.engine.snapshot.extra)
        return {p: dict(c) for p, c in snap.decisions.items()} if snap is not None else {}

    def stats(self) -> dict[str, object]:
        return {**super().stats(), "predictions": self.predictions.stats()}

    async def set_policy(self, changes: Mapping[str, object]) -> dict[str, str]:
        """Admin RPC: the prefill side's keys (``queue``, ``chunking``, ``chunk_size``, ...) and the decode side's
        (``admission.policy``, ``preemption.order``, ...); all are built before any is installed."""
        prompt_changes = {k: v for k, v in changes.items() if k in PROMPT_KEYS}
        decode_changes = {k: v for k, v in changes.items() if k not in PROMPT_KEYS}
        policy = self.prompt_policy
        if prompt_changes:
            spec = policy.spec.updated(prompt_changes)
            policy = build_prefill_policy(spec, self.cost, self.prompt_policy.accelgen)
        if decode_changes:
            await super().set_policy(decode_changes)
        if prompt_changes:
            from tetriserve.worker.colocated_scheduler import TetriColocatedScheduler

            await self.engine.call(lambda s: TetriColocatedScheduler.of(s).configure_prompts(policy))
            self.prompt_policy = policy
        logger.info("colocated %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    def retire(self) -> None:
        super().retire()
        self.predictions.close()
