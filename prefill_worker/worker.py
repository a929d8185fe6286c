"""PrefillWorker: one prefill instance (TetriInfer §3.3), the prefill role of a worker actor
(``worker/actor.py``, which can flip it to decode with the same engine).

    submit(req, front door) ─▶ raw queue ─policy, PrefillSchedBatch at a time─▶ scheduled
                     │ (a prompt of at most prefill.offload_max_tokens, before it queues, or the next in line of a
                     │  backlog, may go to a decode worker with room instead, which computes it: ``handoff.py``)
                     │ length predictor (trained heads in a process of their own, or baseline; parallel mode)
                     │ dispatcher: decode worker from the broadcast loads (power-of-two)
                     ▼
                  vLLM engine: chunked prefill (token budget = ChunkSize), max_tokens=1;
                  the KV connector parks the prompt's KV in this worker's endpoint
                     │ first token ─▶ the front door's stream from this worker, at once (TTFT)
                     ▼
                  KV sent to the chosen decode worker ─▶ decode.take(prompt + first token)
                     ─▶ a ``moved_to`` marker on the front door's stream: the rest comes from there

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
from dataclasses import replace
from typing import Any

from tetriserve.common.config import ClusterConfig
from tetriserve.common.engine_tags import EngineTags
from tetriserve.common.iteration_log import IterationStats
from tetriserve.common.length import LengthPredictor, PredictInput
from tetriserve.common.load import DecodeLoad, PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason, TokenLogprobs
from tetriserve.engine.core_layout import CoreLayout, RoleCpu
from tetriserve.engine.loop_messages import Delta
from tetriserve.engine.worker_base import EngineWorker, build_worker_engine
from tetriserve.observability import tracing
from tetriserve.prefill_worker import spans
from tetriserve.prefill_worker.admission import Offloaded, RequestAborted, SchedBatchGate
from tetriserve.prefill_worker.decode_peers import DecodePeer
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
from tetriserve.prefill_worker.handoff import Handoff
from tetriserve.prefill_worker.kv_sends import watch_sends
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.pipeline import EarlyHandoff
from tetriserve.prefill_worker.policy import build_prefill_policy, load_cost, spec_from_config
from tetriserve.prefill_worker.predictions import PredictionQueue
from tetriserve.prefill_worker.views import ReqView
from tetriserve.transport.instructions import KVInstruction, KVMode

logger = logging.getLogger(__name__)


class PrefillWorker(Handoff, EngineWorker):
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
        self._backlogged = False  # the engine's time for the queue, last priced, was over prefill.offload_wait_s
        self.policy = build_prefill_policy(spec_from_config(config.prefill), self.cost)
        self.ceiling = config.prefill.batch_ceiling(config.engine.max_model_len)
        if predecessor is None:
            self.engine = build_worker_engine(config, model_path, worker_id)
        ceiling, policy = self.ceiling, self.policy
        install = lambda s: TetriPrefillScheduler.assume(s, ceiling).configure(policy)  # noqa: E731
        cpu = RoleCpu.prefill(config.engine.placement(), CoreLayout.from_env())
        self.engine.take_role(install, lambda s: s.log.stats(), cpu.niceness, cpu.borrows, cores=cpu.cores)
        self.gate = SchedBatchGate(self.policy.queue, self.policy.spec.sched_batch)
        self.predictor = predictor
        self.predictions = PredictionQueue(predictor, niceness=config.prefill.predictor_niceness)
        self.dispatcher = make_dispatch_policy(
            config.prefill.dispatch_policy, DispatchParams(config.prefill.heavy_threshold_tokens)
        )
        self.rng = random.Random(zlib.crc32(worker_id.encode()))  # str hash() differs per process
        self.decode_loads: dict[str, DecodeLoad] = {}
        self._dead_decodes: dict[str, int] = {}  # decode id -> the incarnation a call of ours found dead
        self.decode_addresses: dict[str, str] = {}
        self._aborted: dict[str, None] = {}  # insertion-ordered set: ids aborted after leaving the engine
        self._decode_peers: dict[str, DecodePeer] = {}  # the decode workers' current lives, as the handoff calls them
        self._tasks: dict[str, tuple[Request, str, asyncio.Task[None]]] = {}  # id -> (request, subscriber, task)
        self._sends: dict[str, tuple[Any, str]] = {}  # KV key -> (its send's handle, the decode worker)
        self._send_spans: dict[str, tracing.Span] = {}  # KV key -> its send's span (tracing on only)
        self._send_watch: asyncio.Task[None] | None = None
        self._refining: set[asyncio.Task[None]] = set()  # late predictions on their way to decode workers
        # requests handed to decode workers, by how: KV pipelined (pipeline.py), whole, or none (offloaded prompts)
        self.handoffs = {"pipelined": 0, "whole": 0, "offloaded": 0}
        self._offload_task: asyncio.Task[None] | None = None

    # -- wiring --------------------------------------------------------------------
    async def start(self, monitor: Any, scheduler: Any = None) -> str:
        """Start load reports (the length predictor loads on its own thread meanwhile)."""
        if self._report_task is None:
            self._send_watch = asyncio.create_task(
                watch_sends(self.worker_id, self._sends, self._send_spans, self._decode_peers)
            )
            self._offload_task = asyncio.create_task(self._offload_loop())
        return await super().start(monitor, scheduler)

    def update_decode_view(self, loads: list[DecodeLoad], addresses: dict[str, str], handles: dict[str, Any]) -> None:
        """Called by the ClusterMonitor's broadcast (TetriInfer §3.2): the loads of the decode workers that serve
        now, and the addresses and handles of those this worker has not seen in their current life."""
        self.decode_loads = {ld.worker_id: ld for ld in loads if not self._found_dead(ld)}
        self.decode_addresses.update(addresses)
        for decode_id, handle in handles.items():  # a new life: its calls go over a link of its own
            old = self._decode_peers.get(decode_id)
            if old is not None:
                old.close()
            self._decode_peers[decode_id] = DecodePeer(decode_id, handle, self.worker_id)
        self.offer_prompts()

    def _found_dead(self, load: DecodeLoad) -> bool:
        """Whether ``load`` comes from a decode worker's life that a call of ours found dead. The monitor has been
        told (``decode_died``), but broadcasts already on their way still list it, and every migrated request
        dispatched there meanwhile would fail again and spend its migration limit. A later incarnation is new."""
        dead = self._dead_decodes.get(load.worker_id)
        if dead is not None and load.incarnation > dead:
            del self._dead_decodes[load.worker_id]
            return False
        return dead is not None

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
            self.pace.wait_s(self._prefill_s(lens)),  # the queue priced once, its backlog noted
            self.pace.queue_seconds_per_token,
        )

    def _prefill_s(self, lens: list[int]) -> float:
        """The engine's time for the queued prompts of lengths ``lens``; whether it is over
        ``prefill.offload_wait_s`` (decode workers take prompts) is noted for the local share (``pace.left_queue``)."""
        prefill_s = self.pace.prefill_s(lens, self.cost, self.policy.spec.chunk_size)
        self._backlogged = 0 < self.config.prefill.offload_wait_s < prefill_s
        return prefill_s

    def policies(self) -> dict[str, str]:
        return {
            **self.policy.spec.describe(),
            "dispatch": self.dispatcher.name,
            "predictor": self.predictor.name,
            "predictor_state": self.predictions.state.value,
        }

    async def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        """Admin RPC: switch queue policy, chunking, chunk size, PrefillSchedBatch or offload_max_tokens at run time."""
        spec = self.policy.spec.updated(changes)
        if spec.chunk_size > self.ceiling:
            raise ValueError(f"prefill.chunk_size {spec.chunk_size} exceeds this engine's ceiling {self.ceiling}")
        policy = build_prefill_policy(spec, self.cost)
        await self.engine.call(lambda s: s.configure(policy))
        self.gate.set_policy(policy.queue, spec.sched_batch)
        self.policy = policy
        logger.info("prefill %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "scheduler": self.engine.snapshot.extra,
            "predictions": self.predictions.stats(),
            "handoffs": dict(self.handoffs),
        }

    # -- the request path -------------------------------------------------------------
    def submit(self, req: Request, subscriber: str) -> None:
        """Take ``req``; its tokens go to ``subscriber``'s stream from this worker (``subscribe``). A later attempt
        of a request still here replaces the earlier one (the front door has given up on it)."""
        rid = req.request_id
        held = self._tasks.get(rid)
        if held is not None and held[0].attempt >= req.attempt:
            self.publish(subscriber, req, (), FinishReason.ERROR, f"request id {rid} is already here")
            return
        if held is not None:
            self.abort(rid, held[0].attempt)
        task = asyncio.create_task(self._serve(req, subscriber))
        self._tasks[rid] = (req, subscriber, task)
        task.add_done_callback(lambda done: self._forget_task(rid, done))

    def _forget_task(self, rid: str, task: asyncio.Task[None]) -> None:
        held = self._tasks.get(rid)
        if held is not None and held[2] is task:
            del self._tasks[rid]

    def holding(self, subscriber: str) -> tuple[tuple[str, int], ...]:
        return tuple((rid, req.attempt) for rid, (req, sub, _) in self._tasks.items() if sub == subscriber)

    async def _serve(self, req: Request, subscriber: str) -> None:
        span = spans.open_prefill(self.worker_id, req)  # this task's current span; its log lines name the request
        try:
            await self._prefill(req, subscriber)
        except Exception as exc:  # a bug in our adapter: finish the request, keep the worker
            logger.exception("prefill %s: request %s failed", self.worker_id, req.request_id)
            self.publish(subscriber, req, (), FinishReason.ERROR, f"prefill worker failed: {type(exc).__name__}")
            tracing.end(span, error=f"prefill worker failed: {type(exc).__name__}")
        finally:
            tracing.end(span)

    async def _prefill(self, req: Request, subscriber: str) -> None:
        """Prefill ``req`` (its prompt and, for a migrated request, the tokens the client already has), stream
        the next token, and hand the request to a decode worker."""
        key, done = req.kv_key, len(req.resume)
        decodes = req.sampling.max_tokens - done > 1
        seeded = req.sampling.seed is not None and req.sampling.temperature > 0
        view = ReqView(
            key,
            len(req.prompt_token_ids) + done,
            req.sampling.max_tokens - done,
            req.arrival_time,
            priority=req.priority,
            ttft_slo_s=req.slo.ttft_ms / 1000 if req.slo.ttft_ms else None,
            jct_slo_s=req.slo.jct_ms / 1000 if req.slo.jct_ms else None,
            offloadable=decodes and not seeded,
        )
        # TetriInfer's parallel mode: the predictor runs in its own thread while the engine prefills; the KV is
        # parked in this worker's endpoint, so the decode worker is chosen once the first token is out, with the
        # best estimate there is then (``predictions.py``); a prediction still being computed follows the request.
        ticket = refinement = early = chosen = None
        queued = tracing.now_ns()
        if decodes:  # the estimate serves the dispatcher: a prefill-only request needs none
            item = PredictInput(len(req.prompt_token_ids), req.sampling.max_tokens, tuple(req.prompt_token_ids))
            ticket = self.predictions.submit(item)
        try:
            # a short prompt may go to a decode worker before it queues here; refused, it queues
            decode_id = self.offer_short(view) if ticket is not None else None
            if ticket is not None and decode_id is not None and await self._offload(req, subscriber, ticket, decode_id):
                ticket = None  # its estimate went with it, and its prediction follows it if late
                return
            while True:
                try:
                    async with self.gate.turn(view) as batch_seq:
                        if self._backlogged:
                            self.pace.left_queue(view.prompt_len, offloaded=False)
                        computing = spans.queued(queued, batch_seq)
                        if ticket is not None and self.config.transport.pipeline:  # KV may leave as it computes
                            early = EarlyHandoff(self, key, view, ticket)
                        out = await self._run_engine(req, replace(view, batch_seq=batch_seq), park=decodes)
                        spans.computed(computing, out.token_ids, out.finish_reason)
                    break
                except RequestAborted:
                    self.publish(subscriber, req, (), FinishReason.ABORT, index=done)
                    return
                except Offloaded as offer:  # a decode worker computes the prompt; refused, back in line
                    if ticket is not None and await self._offload(req, subscriber, ticket, offer.decode_id):
                        self.pace.left_queue(view.prompt_len, offloaded=True)
                        ticket = None  # its estimate went with it, and its prediction follows it if late
                        return
            tokens, lps = out.token_ids, out.logprobs
            if out.finish_reason is not None or ticket is None:
                # finished at prefill (the GlobalScheduler feeds the outcome back through ``observe``)
                self._aborted.pop(key, None)
                self.endpoint.discard(key)
                reason = FinishReason(out.finish_reason or FinishReason.LENGTH)
                self.publish(subscriber, req, tokens, reason, out.error, index=done, logprobs=lps)
                return
            self.publish(subscriber, req, tokens, index=done, logprobs=lps)  # TTFT waits for no prediction/dispatch
            await asyncio.sleep(0)  # the stream's flush (queued by publish) sends it before the handoff's own work
            self.event(req.request_id, RequestState.TRANSFERRING)
            chosen = await early.outcome() if early is not None else None
            # a choice made on the prediction hands off at once; otherwise the prediction may still be waited for
            waits = chosen is None or (early is not None and early.on_instant)
            wait_s = self.config.prefill.predictor_wait_ms / 1000 if waits else 0.0
            estimate, refinement = await self.predictions.estimate(ticket, wait_s)
            spans.predicted(queued, estimate, late=refinement is not None)
            early = None  # goes on to the handoff below (with the KV it sent, if it chose a decode worker)
        finally:
            if early is not None:  # the request ends here (finished, aborted, failed): what it sent goes
                early.drop()
            if ticket is not None and refinement is None:
                self.predictions.withdraw(ticket)  # a no-op once estimated
        decode = await self._hand_off(req, (*req.resume, *tokens), replace(view, estimate=estimate), subscriber, chosen)
        if refinement is not None:
            if decode is None:
                refinement.cancel()
            else:
                task = asyncio.create_task(self._refine(req, decode, refinement))
                self._refining.add(task)  # held until done (the loop keeps only weak references)
                task.add_done_callback(self._refining.discard)

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
        held = self._tasks.get(request_id)
        if held is None or (attempt is not None and held[0].attempt != attempt):
            return self.forward_abort(request_id, attempt)  # it went on to a decode worker, or is not here
        key = held[0].kv_key
        self.endpoint.discard(key)
        if self.gate.cancel(key):
            return True
        self.engine.abort(key)
        self._aborted[key] = None
        if len(self._aborted) > 10_000:  # ids of requests that had long finished: forget the oldest
            del self._aborted[next(iter(self._aborted))]
        return True

    # -- flips ---------------------------------------------------------------------------
    def idle(self) -> bool:
        return not self._tasks and not self._sends and self.engine.in_flight == 0

    def evict(self, error: str) -> int:
        held = list(self._tasks.items())
        for rid, (req, sub, task) in held:
            task.cancel()
            self.endpoint.discard(req.kv_key)
            self.publish(sub, req, (), FinishReason.ERROR, error, index=len(req.resume), retry=True)
            del self._tasks[rid]
        return len(held)

    def retire(self) -> None:
        super().retire()
        for task in (self._send_watch, self._offload_task):
            if task is not None:
                task.cancel()
        self.predictions.close()

    def _subscriber_gone(self, subscriber: str) -> None:
        for rid, (req, sub, _) in list(self._tasks.items()):
            if sub == subscriber:
                self.abort(rid, req.attempt)
