"""PrefillWorker: one prefill instance (TetriInfer §3.3), run as a named Ray actor.

    submit(req, front door) ─▶ raw queue ─policy, PrefillSchedBatch at a time─▶ scheduled
                     │ length predictor (trained heads or baseline; in a thread, parallel mode)
                     │ dispatcher: decode worker from the broadcast loads (power-of-two)
                     ▼
                  vLLM engine: chunked prefill (token budget = ChunkSize), max_tokens=1;
                  the KV connector parks the prompt's KV in this worker's endpoint
                     │ first token ─▶ the front door's stream from this worker, at once (TTFT)
                     ▼
                  KV sent to the chosen decode worker ─▶ decode.submit(prompt + first token)
                     ─▶ a ``moved_to`` marker on the front door's stream: the rest comes from there

Tokens go straight to the front door that submitted the request (DESIGN.md
§5b); the GlobalScheduler hears only state events. The actor is plain Python
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
from tetriserve.common.length import LengthEstimate, LengthPredictor, PredictInput
from tetriserve.common.load import DecodeLoad, PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason
from tetriserve.engine.settings import EngineRole, build_engine_args
from tetriserve.engine.worker_base import EngineWorker
from tetriserve.prefill_worker.admission import RequestAborted, SchedBatchGate
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
from tetriserve.prefill_worker.dispatch.base import account
from tetriserve.prefill_worker.policy import build_prefill_policy, load_cost, spec_from_config
from tetriserve.prefill_worker.views import ReqView
from tetriserve.transport.instructions import KVInstruction, KVMode

SCHEDULER_CLS = "tetriserve.prefill_worker.vllm_scheduler.TetriPrefillScheduler"

logger = logging.getLogger(__name__)


class PrefillWorker(EngineWorker):
    def __init__(self, worker_id: str, config: ClusterConfig, model_path: str, predictor: LengthPredictor) -> None:
        from tetriserve.engine.cores import claim_cores
        from tetriserve.engine.hardware import detect_hardware
        from tetriserve.engine.loop import EngineLoop

        super().__init__(worker_id, config)
        self.cost = load_cost(config.prefill, model_path, detect_hardware())
        self.policy = build_prefill_policy(spec_from_config(config.prefill), self.cost)
        self.ceiling = config.prefill.batch_ceiling(config.engine.max_model_len)
        args = build_engine_args(
            config.engine,
            model_path,
            EngineRole.PREFILL,
            chunk_size=self.ceiling,
            endpoint=worker_id,
            transport=config.transport,
            kv_deadline_s=config.kv_transfer_timeout_s,
            scheduler_cls=SCHEDULER_CLS,
        )
        self.engine = EngineLoop(
            args,
            worker_id,
            snapshot_fn=lambda s: s.log.stats(),
            cores=claim_cores(config.engine.threads_per_engine, borrows=False),  # posts when it steps
        )
        self.engine.call_now(lambda s: s.configure(self.policy))
        self.gate = SchedBatchGate(self.policy.queue, self.policy.spec.sched_batch)
        self.predictor = predictor
        self.dispatcher = make_dispatch_policy(
            config.prefill.dispatch_policy, DispatchParams(config.prefill.heavy_threshold_tokens)
        )
        self.rng = random.Random(zlib.crc32(worker_id.encode()))  # str hash() differs per process
        self.decode_loads: dict[str, DecodeLoad] = {}
        self.decode_addresses: dict[str, str] = {}
        self._aborted: dict[str, None] = {}  # insertion-ordered set: ids aborted after leaving the engine
        self._decode_handles: dict[str, Any] = {}
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # request id -> (subscriber, its task)

    # -- wiring --------------------------------------------------------------------
    async def start(self, monitor: Any, scheduler: Any = None) -> str:
        """Load the length predictor before the first request needs it, then start load reports."""
        await asyncio.to_thread(self.predictor.warm_up)
        return await super().start(monitor, scheduler)

    def update_decode_view(self, loads: list[DecodeLoad], addresses: dict[str, str], handles: dict[str, Any]) -> None:
        """Called by the ClusterMonitor's broadcast (TetriInfer §3.2)."""
        self.decode_loads = {ld.worker_id: ld for ld in loads}
        self.decode_addresses.update(addresses)
        self._decode_handles.update(handles)

    def observe(self, prompt_len: int, output_len: int) -> None:
        self.predictor.observe(prompt_len, output_len)

    def load(self) -> PrefillLoad:
        return PrefillLoad(
            self.worker_id, self.gate.queued, self.engine.in_flight, self.gate.queued_tokens, time.time()
        )

    def policies(self) -> dict[str, str]:
        return {**self.policy.spec.describe(), "dispatch": self.dispatcher.name}

    async def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        """Admin RPC: switch queue policy, chunking, chunk size or PrefillSchedBatch at run time."""
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
        return {**super().stats(), "scheduler": self.engine.snapshot.extra}

    # -- the request path -------------------------------------------------------------
    def submit(self, req: Request, subscriber: str) -> None:
        """Take ``req``; its tokens go to ``subscriber``'s stream from this worker (``subscribe``)."""
        if req.request_id in self._tasks:
            self.publish(subscriber, req, (), FinishReason.ERROR, f"request id {req.request_id} is already here")
            return
        task = asyncio.create_task(self._serve(req, subscriber))
        self._tasks[req.request_id] = (subscriber, task)
        task.add_done_callback(lambda _: self._tasks.pop(req.request_id, None))

    async def _serve(self, req: Request, subscriber: str) -> None:
        try:
            await self._prefill(req, subscriber)
        except Exception as exc:  # a bug in our adapter: finish the request, keep the worker
            logger.exception("prefill %s: request %s failed", self.worker_id, req.request_id)
            self.publish(subscriber, req, (), FinishReason.ERROR, f"prefill worker failed: {type(exc).__name__}")

    async def _prefill(self, req: Request, subscriber: str) -> None:
        rid = req.request_id
        view = ReqView(
            rid,
            len(req.prompt_token_ids),
            req.sampling.max_tokens,
            req.arrival_time,
            priority=req.priority,
            ttft_slo_s=req.slo.ttft_ms / 1000 if req.slo.ttft_ms else None,
            jct_slo_s=req.slo.jct_ms / 1000 if req.slo.jct_ms else None,
        )
        decodes = req.sampling.max_tokens > 1
        # TetriInfer's parallel mode: the predictor runs in a thread while the engine prefills; the KV is
        # parked in this worker's endpoint, so the decode worker can be chosen once the estimate is known.
        predicting = None
        if decodes:  # the estimate serves the dispatcher: a prefill-only request needs none
            item = PredictInput(view.prompt_len, view.max_tokens, tuple(req.prompt_token_ids))
            predicting = asyncio.ensure_future(asyncio.to_thread(self.predictor.predict, [item]))
        try:
            async with self.gate.turn(view) as batch_seq:
                tokens, reason, error = await self._run_engine(req, replace(view, batch_seq=batch_seq), park=decodes)
        except RequestAborted:
            self.publish(subscriber, req, (), FinishReason.ABORT)
            return
        if reason is not None or predicting is None:
            # finished at prefill (the GlobalScheduler feeds the outcome back through ``observe``)
            if predicting is not None:
                predicting.cancel()
            self._aborted.pop(rid, None)
            self.endpoint.discard(rid)
            self.publish(subscriber, req, tokens, FinishReason(reason or FinishReason.LENGTH), error)
            return
        self.publish(subscriber, req, tokens)  # TTFT does not wait for the prediction or the dispatch
        self.event(rid, RequestState.TRANSFERRING)
        estimate = await self._estimate(predicting, view)
        decode_id = await self._choose_decode(replace(view, estimate=estimate))
        error = (
            "no decode worker is accepting requests" if decode_id is None else await self._forward_kv(rid, decode_id)
        )
        if rid in self._aborted:  # aborted after its first token, before the handoff
            del self._aborted[rid]
            self.endpoint.discard(rid)
            self.publish(subscriber, req, (), FinishReason.ABORT, index=len(tokens))
            return
        if error is not None or decode_id is None:
            self.endpoint.discard(rid)
            self.publish(subscriber, req, (), FinishReason.ERROR, error, index=len(tokens))
            return
        decode = self._decode(decode_id)
        if not await decode.submit.remote(req, tokens[0], estimate, subscriber):
            error = f"decode worker {decode_id} refused the request"
            self.publish(subscriber, req, (), FinishReason.ERROR, error, index=len(tokens))
            return
        self.handed_on(rid, decode)
        if rid in self._aborted:  # aborted while the decode worker took it: abort it there
            del self._aborted[rid]
            self.forward_abort(rid)
        self.publish(subscriber, req, (), index=len(tokens), moved_to=decode_id)
        self.event(rid, RequestState.DECODE_QUEUED, decode_id, moved_to=decode_id)

    async def _estimate(self, predicting: asyncio.Future[list[LengthEstimate]], view: ReqView) -> LengthEstimate:
        try:
            return (await predicting)[0]
        except Exception:  # a broken predictor must not fail requests: fall back to "anything up to max_tokens"
            logger.exception("prefill %s: length prediction failed for %s", self.worker_id, view.request_id)
            return LengthEstimate(0, view.max_tokens // 2, view.max_tokens + 1, -1, 0.0, "fallback")

    async def _forward_kv(self, rid: str, decode_id: str) -> str | None:
        """Send the parked KV to the chosen decode worker; returns an error message or None."""
        buffers = await self.parked_kv(rid, lambda: rid in self._aborted)  # parked with the first token
        if buffers is None:
            return f"prefilled KV of {rid} was not found on {self.worker_id}"
        self.endpoint.send(self.decode_addresses[decode_id], rid, buffers, self.config.kv_transfer_timeout_s)
        return None

    async def _choose_decode(self, view: ReqView) -> str | None:
        deadline = time.monotonic() + self.config.kv_transfer_timeout_s
        while True:
            choice = self.dispatcher.choose(view, list(self.decode_loads.values()), self.rng)
            if choice is not None and choice in self.decode_addresses:
                self._account(choice, view)
                return choice
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self.config.report_interval_ms / 1000)

    def _account(self, worker_id: str, view: ReqView) -> None:
        """Update the local copy of the broadcast view so bursts between broadcasts do not herd."""
        self.decode_loads[worker_id] = account(
            self.decode_loads[worker_id], view, self.config.prefill.heavy_threshold_tokens
        )

    async def _run_engine(
        self, req: Request, view: ReqView, park: bool
    ) -> tuple[tuple[int, ...], str | None, str | None]:
        """Prefill ``req``: (its first token(s), the finish reason if it ended here, an error)."""
        from tetriserve.engine.sampling import to_vllm

        kv = KVInstruction(KVMode.PARK, req.request_id) if park else None
        tags = EngineTags(
            request_id=req.request_id,
            arrival=view.arrival_time,
            priority=view.priority,
            batch_seq=view.batch_seq,
            ttft_slo_s=view.ttft_slo_s,
            jct_slo_s=view.jct_slo_s,
        )
        params = to_vllm(req.sampling, max_tokens=1, kv=kv, tags=tags)
        tokens: list[int] = []
        reason = error = None
        async for delta in self.engine.generate(req.request_id, req.prompt_token_ids, params):
            tokens.extend(delta.token_ids)
            reason, error = delta.finish_reason, delta.error
        if reason == "length" and park:
            reason = None  # max_tokens=1 is ours, not the client's: the request goes on to decode
        return tuple(tokens), reason, error

    def abort(self, request_id: str) -> bool:
        """Abort wherever the request is: raw queue, engine, between its first token and the handoff, or on
        the decode worker it was handed to."""
        self.endpoint.discard(request_id)
        if self.forward_abort(request_id):
            return True
        if self.gate.cancel(request_id):
            return True
        self.engine.abort(request_id)
        self._aborted[request_id] = None
        if len(self._aborted) > 10_000:  # ids of requests that had long finished: forget the oldest
            del self._aborted[next(iter(self._aborted))]
        return True

    def _subscriber_gone(self, subscriber: str) -> None:
        for rid, (sub, _) in list(self._tasks.items()):
            if sub == subscriber:
                self.abort(rid)

    def _decode(self, worker_id: str) -> Any:
        return self._decode_handles[worker_id]
