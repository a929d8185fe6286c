"""PrefillWorker: one prefill instance (TetriInfer §3.3), the prefill role of a worker actor
(``worker/actor.py``, which can flip it to decode with the same engine).

    submit(req, front door) ─▶ raw queue ─policy, PrefillSchedBatch at a time─▶ scheduled
                     │ (a prompt of at most prefill.offload_max_tokens, before it queues, or the next in line of a
                     │  backlog, may go to a decode worker with room instead, which computes it: ``offload.py``)
                     │ length predictor (trained heads in a process of their own, or baseline; parallel mode)
                     │ dispatcher: decode worker from the broadcast loads (power-of-two)
                     ▼
                  vLLM engine: chunked prefill (token budget = ChunkSize), max_tokens=1;
                  the KV connector parks the prompt's KV in this worker's endpoint
                     │ first token ─▶ the front door's stream from this worker, at once (TTFT)
                     ▼
                  KV sent to the chosen decode worker ─▶ decode.take(prompt + first token)
                     ─▶ a ``moved_to`` marker on the front door's stream: the rest comes from there

Each request is a ``PrefillJob`` (``lifecycle.py``) that its own task drives through QUEUED → COMPUTING →
PARKED → HANDED, or OFFLOADED, FINISHED, ABORTED, FAILED. The worker owns the request's stream and its state
events; the parts it drives each own one concern: the gate (``admission.py``, PrefillSchedBatch), the length
predictions (``predictions.py``), the decode directory (``directory.py``: loads, addresses, peers, dispatch),
the KV sender (``kv_sends.py``), the pipelined handoff (``pipeline.py``), the handoff (``handoff.py``) and the
offloader (``offload.py``).

Tokens go straight to the front door that submitted the request, never through
a central actor; the GlobalScheduler hears only state events. The actor is plain Python
over the engine adapter; Ray-specific code is the handful of actor calls to the
monitor and decode workers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from tetriserve.common.config import ClusterConfig
from tetriserve.common.decisions import as_settings, decisions_of
from tetriserve.common.engine_tags import EngineTags
from tetriserve.common.iteration_log import IterationStats
from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput
from tetriserve.common.load import DecodeLoad, PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason, TokenLogprobs
from tetriserve.engine.core_layout import CoreLayout, RoleCpu
from tetriserve.engine.loop_messages import Delta
from tetriserve.engine.ray_api import MonitorHandle, SchedulerHandle
from tetriserve.engine.worker_base import EngineWorker, build_worker_engine
from tetriserve.observability import tracing
from tetriserve.prefill_worker import spans
from tetriserve.prefill_worker.admission import Offloaded, RequestAborted, SchedBatchGate
from tetriserve.prefill_worker.decode_peers import DecodeHandle, DecodePeer
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
from tetriserve.prefill_worker.handoff import Handoff, NotHanded
from tetriserve.prefill_worker.kv_sends import KVSender
from tetriserve.prefill_worker.lifecycle import Phase, PrefillJob, view_of
from tetriserve.prefill_worker.offload import Offloader
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.pipeline import EarlyHandoff, leaves_in_parts
from tetriserve.prefill_worker.policy import AccelGenParams, build_prefill_policy, load_cost, spec_from_config
from tetriserve.prefill_worker.predictions import PredictionQueue, Ticket
from tetriserve.prefill_worker.views import ReqView
from tetriserve.transport.instructions import KVInstruction, KVMode

logger = logging.getLogger(__name__)


class PrefillWorker(EngineWorker):
    def __init__(
        self,
        worker_id: str,
        config: ClusterConfig,
        model_path: str,
        predictor: LengthPredictor,
        incarnation: int = 0,
        predecessor: EngineWorker | None = None,
    ) -> None:
        """``predecessor``: the decode role this worker played until a flip; its engine serves prefill now."""
        from tetriserve.engine.hardware import detect_hardware
        from tetriserve.prefill_worker.vllm_scheduler import TetriPrefillScheduler

        super().__init__(worker_id, config, incarnation, predecessor)
        self.cost = load_cost(config.prefill, model_path, detect_hardware())
        self.pace = PrefillPace()
        self.policy = build_prefill_policy(
            spec_from_config(config.prefill), self.cost, AccelGenParams.from_config(config.prefill)
        )
        self.ceiling = config.prefill.batch_ceiling(config.engine.max_model_len)
        if predecessor is None:
            self.engine = build_worker_engine(config, model_path, worker_id)
        ceiling, policy = self.ceiling, self.policy
        install = lambda s: TetriPrefillScheduler.assume(s, ceiling).configure(policy)  # noqa: E731
        cpu = RoleCpu.prefill(config.engine.placement(), CoreLayout.from_env())
        log = lambda s: TetriPrefillScheduler.of(s).log.stats()  # noqa: E731
        self.engine.take_role(install, log, cpu.niceness, cpu.borrows, cores=cpu.cores)
        self.gate = SchedBatchGate(self.policy.queue, self.policy.spec.sched_batch)
        self.predictor = predictor
        self.predictions = PredictionQueue(predictor, niceness=config.prefill.predictor_niceness)
        dispatcher = make_dispatch_policy(
            config.prefill.dispatch_policy, DispatchParams(config.prefill.heavy_threshold_tokens)
        )
        rng = random.Random(zlib.crc32(worker_id.encode()))  # str hash() differs per process
        self.directory = DecodeDirectory(
            worker_id, dispatcher, rng, config.prefill.heavy_threshold_tokens, self._tell_monitor_dead
        )
        self.sender = KVSender(worker_id, self.endpoint, self.directory, config.transport.timeout_s)
        self.handoff = Handoff(config, self.endpoint, self.directory, self.sender, self.predictions, self.parked_kv)
        self.offloader = Offloader(
            worker_id, self.gate, self.pace, self.directory, self.cost, self.policy.spec, config.prefill.offload_wait_s
        )
        self._jobs: dict[str, PrefillJob] = {}  # request id -> its job on this worker, until its task ends
        # requests handed to decode workers, by how: KV pipelined (pipeline.py), whole, or none (offloaded prompts)
        self.handoffs = {"pipelined": 0, "whole": 0, "offloaded": 0}
        self._offload_task: asyncio.Task[None] | None = None

    # -- wiring --------------------------------------------------------------------
    async def start(self, monitor: MonitorHandle, scheduler: SchedulerHandle | None = None) -> str:
        """Start load reports (the length predictor loads on its own thread meanwhile)."""
        if self._report_task is None:
            self.sender.start()
            self._offload_task = asyncio.create_task(self.offloader.run(self.config.report_interval_ms / 1000))
        return await super().start(monitor, scheduler)

    def update_decode_view(
        self, loads: list[DecodeLoad], addresses: Mapping[str, str], handles: Mapping[str, DecodeHandle]
    ) -> None:
        """Called by the ClusterMonitor's broadcast (TetriInfer §3.2): the loads of the decode workers that serve
        now, and the addresses and handles of those this worker has not seen in their current life."""
        self.directory.update(loads, addresses, handles)
        self.offloader.offer_prompts()

    def _tell_monitor_dead(self, decode_id: str, incarnation: int) -> None:
        if self._monitor is not None:
            self._monitor.mark_dead.remote(decode_id, incarnation)

    def load(self) -> PrefillLoad:
        lens = self.gate.queued_lens()
        snapshot = self.engine.snapshot  # the engine's counters and its scheduler's iteration log, published together
        if isinstance(snapshot.extra, IterationStats):  # none before the role's scheduler is installed
            self.pace.observe(snapshot.stats, snapshot.extra.tokens, backlogged=bool(lens))
        return PrefillLoad(
            self.worker_id,
            len(lens),
            self.engine.in_flight,
            sum(lens),
            time.time(),
            self.incarnation,
            self.engine.steps,
            self.engine.in_flight > 0,
            self.pace.wait_s(self.offloader.prefill_s(lens)),  # the queue priced once, its backlog noted
            self.pace.queue_seconds_per_token,
            snapshot.stats.total_blocks,
        )

    def policies(self) -> dict[str, str]:
        return {
            **self.policy.spec.describe(),
            "dispatch": self.directory.dispatcher.name,
            "predictor": self.predictor.name,
            "predictor_state": self.predictions.state.value,
            **as_settings(self.decisions()),
        }

    def decisions(self) -> dict[str, dict[str, int]]:
        return decisions_of((self.policy.queue, self.policy.chunking, self.directory.dispatcher))

    async def set_policy(self, changes: dict[str, object]) -> dict[str, str]:
        """Admin RPC: switch queue policy, chunking, chunk size, PrefillSchedBatch or offload_max_tokens at run time."""
        spec = self.policy.spec.updated(changes)
        if spec.chunk_size > self.ceiling:
            raise ValueError(f"prefill.chunk_size {spec.chunk_size} exceeds this engine's ceiling {self.ceiling}")
        policy = build_prefill_policy(spec, self.cost, self.policy.accelgen)
        from tetriserve.prefill_worker.vllm_scheduler import TetriPrefillScheduler

        await self.engine.call(lambda s: TetriPrefillScheduler.of(s).configure(policy))
        self.gate.set_policy(policy.queue, spec.sched_batch)
        self.offloader.set_spec(spec)
        self.policy = policy
        logger.info("prefill %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    def stats(self) -> dict[str, object]:
        return {
            **super().stats(),
            "scheduler": self.engine.snapshot.extra,
            "predictions": self.predictions.stats(),
            "handoffs": dict(self.handoffs),
            "requests": dict(Counter(job.phase.value for job in self._jobs.values())),
        }

    # -- the request path -------------------------------------------------------------
    def submit(self, req: Request, subscriber: str) -> None:
        """Take ``req``; its tokens go to ``subscriber``'s stream from this worker (``subscribe``). A later attempt
        of a request still here replaces the earlier one (the front door has given up on it)."""
        rid = req.request_id
        held = self._jobs.get(rid)
        if held is not None and held.req.attempt >= req.attempt:
            self.publish(subscriber, req, (), FinishReason.ERROR, f"request id {rid} is already here")
            return
        if held is not None:
            self.abort(rid, held.req.attempt)
        job = PrefillJob(req, subscriber, view_of(req))
        self._jobs[rid] = job
        job.task = asyncio.create_task(self._serve(job))
        job.task.add_done_callback(lambda _: self._forget(job))

    def _forget(self, job: PrefillJob) -> None:
        rid = job.req.request_id
        if self._jobs.get(rid) is job:
            del self._jobs[rid]

    def holding(self, subscriber: str) -> tuple[tuple[str, int], ...]:
        return tuple((rid, job.req.attempt) for rid, job in self._jobs.items() if job.subscriber == subscriber)

    async def _serve(self, job: PrefillJob) -> None:
        span = spans.open_prefill(self.worker_id, job.req)  # this task's current span; its log lines name the request
        try:
            await self._drive(job)
        except Exception as exc:  # a bug in our adapter: finish the request, keep the worker
            logger.exception("prefill %s: request %s failed", self.worker_id, job.req.request_id)
            job.end(Phase.FAILED)
            self._end(job, FinishReason.ERROR, f"prefill worker failed: {type(exc).__name__}")
            tracing.end(span, error=f"prefill worker failed: {type(exc).__name__}")
        finally:
            tracing.end(span)

    async def _drive(self, job: PrefillJob) -> None:
        """Take ``job`` from QUEUED to its end: prefill its prompt (and, for a migrated request, the tokens the
        client already has), stream the next token, and hand it to a decode worker; or have a decode worker
        compute it. TetriInfer's parallel mode: the predictor runs in its own thread while the engine prefills;
        the KV is parked in this worker's endpoint, so the decode worker is chosen once the first token is out,
        with the best estimate there is then (``predictions.py``); a prediction still being computed follows the
        request."""
        req = job.req
        job.queued_ns = tracing.now_ns()
        if job.decodes:  # the estimate serves the dispatcher: a prefill-only request needs none
            item = PredictInput(len(req.prompt_token_ids), req.sampling.max_tokens, tuple(req.prompt_token_ids))
            job.ticket = self.predictions.submit(item)
            # the policies' S_g (AccelGen §4.3): the instant estimate now, the prediction once it is out
            self._estimated(job, self.predictions.predictor.instant(item))
            job.ticket.future.add_done_callback(lambda f: self._prediction_out(job, f))
        try:
            if job.ticket is not None and not await self._await_prediction(job):
                return
            # a short prompt may go to a decode worker before it queues here; refused, it queues
            decode_id = self.offloader.offer_short(job.view) if job.ticket is not None else None
            if decode_id is not None and await self._offload(job, decode_id):
                return
            out = await self._compute(job)
            if out is None:  # aborted in the queue, or a decode worker computes it
                return
            if out.finish_reason is not None or not job.decodes:
                self._finish(job, out)  # the GlobalScheduler feeds the outcome back through ``observe``
                return
            chosen, refinement = await self._park(job, out)
        finally:
            if job.early is not None:  # the request ends here (finished, aborted, failed): what it sent goes
                job.early.drop()
                job.early = None
            if job.ticket is not None:
                self.predictions.withdraw(job.ticket)
                job.ticket = None
        await self._hand_off(job, (*req.resume, *out.token_ids), chosen, refinement)

    async def _await_prediction(self, job: PrefillJob) -> bool:
        """Wait up to ``prefill.predictor_queue_wait_ms`` for the prediction before the request queues (its view
        takes the prediction in ``_prediction_out``); False where it was aborted meanwhile (and is ended)."""
        if job.ticket is not None:
            await self.predictions.within(job.ticket, self.config.prefill.predictor_queue_wait_ms / 1000)
        if job.abort_requested:
            job.advance(Phase.ABORTED)
            self._end(job, FinishReason.ABORT)
            return False
        return True

    async def _compute(self, job: PrefillJob) -> Delta | None:
        """QUEUED → COMPUTING: its PrefillSchedBatch turn, then the engine's chunked prefill. None where it left
        the queue otherwise: aborted there, or offered to a decode worker that took it (refused, back in line)."""
        while True:
            try:
                async with self.gate.turn(job.view) as batch_seq:
                    job.advance(Phase.COMPUTING)
                    if self.offloader.backlogged:
                        self.pace.left_queue(job.view.prompt_len, offloaded=False)
                    computing = spans.queued(job.queued_ns, batch_seq)
                    if job.ticket is not None and self.config.transport.pipeline:  # KV may leave as it computes
                        job.early = self._early_handoff(job, job.ticket)
                    out = await self._run_engine(job.req, replace(job.view, batch_seq=batch_seq), park=job.decodes)
                    spans.computed(computing, out.token_ids, out.finish_reason)
                return out
            except RequestAborted:
                job.advance(Phase.ABORTED)
                self._end(job, FinishReason.ABORT)
                return None
            except Offloaded as offer:
                if job.ticket is not None and await self._offload(job, offer.decode_id):
                    self.pace.left_queue(job.view.prompt_len, offloaded=True)
                    return None

    def _estimated(self, job: PrefillJob, estimate: LengthEstimate) -> None:
        """``estimate`` (of the request's whole output) becomes its view's, less the tokens a migrated request's
        client has already: the gate orders by it while the request queues."""
        job.view = replace(job.view, estimate=estimate.after(len(job.req.resume)))
        self.gate.update(job.view)

    def _prediction_out(self, job: PrefillJob, future: asyncio.Future[LengthEstimate | None]) -> None:
        """The prediction is out while the request is here: the gate's view or, once it is computing, the
        engine's tags take it."""
        if future.cancelled() or future.result() is None or self._jobs.get(job.req.request_id) is not job:
            return
        estimate = future.result()
        assert estimate is not None
        if job.phase is Phase.QUEUED:
            self._estimated(job, estimate)
        elif job.phase is Phase.COMPUTING:
            from tetriserve.prefill_worker.vllm_scheduler import TetriPrefillScheduler

            after = estimate.after(len(job.req.resume))
            job.view = replace(job.view, estimate=after)
            key = job.key
            task = asyncio.ensure_future(self.engine.call(lambda s: TetriPrefillScheduler.of(s).retag(key, after)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a request already out: no matter

    def _early_handoff(self, job: PrefillJob, ticket: Ticket) -> EarlyHandoff:
        several_parts = leaves_in_parts(self.policy.spec, self.policy.cost, job.view.prompt_len)
        instant = self.predictions.predictor.instant
        return EarlyHandoff(job, ticket, self.directory, self.sender, instant, several_parts)

    def _finish(self, job: PrefillJob, out: Delta) -> None:
        """COMPUTING → FINISHED (or ABORTED): the engine ended it at its first token."""
        self.endpoint.discard(job.key)
        reason = FinishReason(out.finish_reason or FinishReason.LENGTH)
        job.advance(Phase.ABORTED if reason is FinishReason.ABORT else Phase.FINISHED)
        self._end(job, reason, out.error, out.token_ids, out.logprobs)

    async def _park(
        self, job: PrefillJob, out: Delta
    ) -> tuple[tuple[str, str | None] | None, asyncio.Future[LengthEstimate | None] | None]:
        """COMPUTING → PARKED: stream the first token at once (TTFT waits for no prediction or dispatch), then
        settle the estimate the handoff goes with. Returns the pipelined handoff's choice (decode worker,
        forwarding error), if it made one, and the prediction still to follow the request, if late."""
        req, early, ticket = job.req, job.early, job.ticket
        assert ticket is not None
        self.publish(job.subscriber, req, out.token_ids, index=job.index, logprobs=out.logprobs)
        await asyncio.sleep(0)  # the stream's flush (queued by publish) sends it before the handoff's own work
        job.advance(Phase.PARKED)
        self.event(req.request_id, RequestState.TRANSFERRING)
        chosen = await early.outcome() if early is not None else None
        # a choice made on the prediction hands off at once; otherwise the prediction may still be waited for
        waits = chosen is None or (early is not None and early.on_instant)
        wait_s = self.config.prefill.predictor_wait_ms / 1000 if waits else 0.0
        estimate, refinement = await self.predictions.estimate(ticket, wait_s)
        job.ticket = None  # estimated: a late prediction follows the request (``refinement``)
        job.early = None  # goes on to the handoff (with the KV it sent, if it chose a decode worker)
        spans.predicted(job.queued_ns, estimate, late=refinement is not None)
        self._settle(job, estimate)
        return chosen, refinement

    @staticmethod
    def _settle(job: PrefillJob, estimate: LengthEstimate) -> None:
        """``estimate`` is the one ``job``'s request goes on with: on the request (the decode worker, the
        GlobalScheduler's table and the client's final metrics read it there) and in the job's view."""
        job.req.length_estimate = estimate
        job.view = replace(job.view, estimate=estimate)

    async def _hand_off(
        self,
        job: PrefillJob,
        generated: tuple[int, ...],
        chosen: tuple[str, str | None] | None,
        refinement: asyncio.Future[LengthEstimate | None] | None,
    ) -> None:
        """PARKED → HANDED, or ABORTED, or FAILED with a ``retry`` error (the front door migrates it)."""
        result = await self.handoff.run(job, generated, chosen)
        if isinstance(result, NotHanded):
            if refinement is not None:
                refinement.cancel()
            job.advance(Phase.ABORTED if result.error is None else Phase.FAILED)
            if result.error is None:
                self._end(job, FinishReason.ABORT, index=len(generated))
            else:
                self._end(job, FinishReason.ERROR, result.error, index=len(generated), retry=True)
            return
        self.handoffs["pipelined" if result.pipelined else "whole"] += 1
        job.advance(Phase.HANDED)
        self._went_on(job, result.decode_id, result.peer, index=len(generated))
        if refinement is not None:
            self.handoff.follow(job.req, result.peer, refinement)

    async def _offload(self, job: PrefillJob, decode_id: str) -> bool:
        """QUEUED → OFFLOADED: give ``job``, not computed here, to ``decode_id`` to compute its prompt there; True
        if it took it, or the request was aborted meanwhile (ended here). Refused (no room there any more, or
        gone), it waits here again; a prediction not started by then is dropped (the instant estimate goes with
        it at its handoff), as for a handoff that does not wait."""
        assert job.ticket is not None
        estimate, refinement = await self.predictions.estimate(job.ticket)
        self._settle(job, estimate)
        peer = await self.offloader.take(job, decode_id)
        if peer is None:
            if not job.abort_requested:
                return False
            if refinement is not None:  # no one to follow
                refinement.cancel()
            job.ticket = None
            job.advance(Phase.ABORTED)
            self._end(job, FinishReason.ABORT)
            return True
        job.ticket = None  # its estimate went with it, and its prediction follows it if late
        self.handoffs["offloaded"] += 1
        job.advance(Phase.OFFLOADED)
        self._went_on(job, decode_id, peer, index=job.index)
        if refinement is not None:
            self.handoff.follow(job.req, peer, refinement)
        return True

    def _went_on(self, job: PrefillJob, decode_id: str, peer: DecodePeer, index: int) -> None:
        """A decode worker took ``job``: the stream and an abort follow it there."""
        rid = job.req.request_id
        self.handed_on(rid, peer.handle)
        if job.abort_requested:  # aborted while the decode worker took it: abort it there
            self.forward_abort(rid, job.req.attempt)
        self.publish(job.subscriber, job.req, (), index=index, moved_to=decode_id)
        self.event(rid, RequestState.DECODE_QUEUED, decode_id, moved_to=decode_id, estimate=job.req.length_estimate)

    def _end(
        self,
        job: PrefillJob,
        reason: FinishReason,
        error: str | None = None,
        tokens: tuple[int, ...] = (),
        logprobs: tuple[TokenLogprobs, ...] | None = None,
        index: int | None = None,
        retry: bool = False,
    ) -> None:
        """The last chunk of ``job``'s stream from this worker."""
        index = job.index if index is None else index
        self.publish(job.subscriber, job.req, tokens, reason, error, index=index, logprobs=logprobs, retry=retry)

    async def _run_engine(self, req: Request, view: ReqView, park: bool) -> Delta:
        """Prefill ``req``: its next token (with its logprobs, if asked), the finish reason if it ended here, an
        error."""
        from tetriserve.engine.sampling import to_vllm

        key = req.kv_key
        kv = KVInstruction(KVMode.PARK, key) if park else None
        tags = EngineTags(
            request_id=key,
            arrival=view.arrival_time,
            priority=view.priority,
            batch_seq=view.batch_seq,
            ttft_slo_s=view.ttft_slo_s,
            jct_slo_s=view.jct_slo_s,
            estimate=view.estimate,
            max_tokens=view.max_tokens,  # the engine runs it to its first token; S_g reads the client's cap
        )
        params = to_vllm(req.sampling, max_tokens=1, prior_outputs=len(req.resume), kv=kv, tags=tags)
        tokens: list[int] = []
        logprobs: list[TokenLogprobs] | None = None if req.sampling.logprobs is None else []
        reason = error = None
        async for delta in self.engine.generate(key, (*req.prompt_token_ids, *req.resume), params):
            tokens.extend(delta.token_ids)
            if logprobs is not None:
                logprobs.extend(delta.logprobs or ())
            reason, error = delta.finish_reason, delta.error
        if reason == "length" and park:
            reason = None  # max_tokens=1 is ours, not the client's: the request goes on to decode
        return Delta(tuple(tokens), reason, error, None if logprobs is None else tuple(logprobs))

    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        """Abort wherever the request is: raw queue, engine, between its first token and the handoff, or on
        the decode worker it was handed to. ``attempt``: only that attempt (None: whichever is here)."""
        job = self._jobs.get(request_id)
        if job is None or (attempt is not None and job.req.attempt != attempt):
            return self.forward_abort(request_id, attempt)  # it went on to a decode worker, or is not here
        if job.phase in (Phase.HANDED, Phase.OFFLOADED):
            return self.forward_abort(request_id, attempt)
        if job.done:
            return True
        job.abort_requested = True  # whichever step comes next ends it (an offer's take, a send, the handoff)
        if job.phase is Phase.QUEUED and job.ticket is not None:
            self.predictions.withdraw(job.ticket)  # ends a wait for the prediction (``_await_prediction``) now
        self.endpoint.discard(job.key)
        if self.gate.cancel(job.key):
            return True
        self.engine.abort(job.key)
        return True

    # -- flips ---------------------------------------------------------------------------
    def idle(self) -> bool:
        return not self._jobs and not self.sender.in_flight and self.engine.in_flight == 0

    def evict(self, error: str) -> int:
        jobs = list(self._jobs.values())
        for job in jobs:
            if job.task is not None:
                job.task.cancel()
            self.endpoint.discard(job.key)
            job.end(Phase.FAILED)
            self._end(job, FinishReason.ERROR, error, retry=True)
        self._jobs.clear()
        return len(jobs)

    def retire(self) -> None:
        super().retire()
        self.sender.stop()
        if self._offload_task is not None:
            self._offload_task.cancel()
        self.directory.close()
        self.predictions.close()

    def _subscriber_gone(self, subscriber: str) -> None:
        for rid, job in list(self._jobs.items()):
            if job.subscriber == subscriber:
                self.abort(rid, job.req.attempt)
