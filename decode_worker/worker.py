"""DecodeWorker: one decode instance (TetriInfer §3.4), the decode role of a worker actor
(``worker/actor.py``, which can flip it to prefill with the same engine).

    take(req, generated, front door) ─▶ vLLM engine (prompt + tokens so far, KV expected from the connector)
                                  │ request waits in WAITING_FOR_REMOTE_KVS until its KV has landed,
                                  │ then only the first token's KV is computed; continuous batching
                                  ▼
    engine deltas (one batch per step) ─▶ the front door's stream from this worker (``subscribe``)

``take`` returns at once. Each request's tokens go straight to the front door
that owns it, through that front door's one multiplexed stream from this worker
(``channel/streams.py``): one message per engine step for all its requests. The
engine is stepped by its own loop (``engine.loop``); this actor sends it
commands and reads the snapshot it publishes. A step's tokens leave from the
engine thread itself (``_tokens_now``), so that the actor's event loop, which
shares the engine's interpreter lock, does not run once per step; it takes a
request's first token (a state event), its finish and its slice end. Admission
(``decode.admission``), the preemption victim order and swap-or-recompute
(``decode.preemption``) are decided in the engine's scheduler
subclass (``vllm_scheduler.py``); SCLS slice moves are ``moves.py``.

A request is known by its id and placement ``attempt``: a later attempt of a
request still here (the front door migrated it after a failure) replaces the
earlier one, and an abort naming an attempt touches only that one. Its engine
request and KV key are ``Request.kv_key``, one per attempt. A KV transfer the
prefill worker reports failed (the actor's ``kv_failed``) fails that load at once; the
engine then recomputes the prompt or fails the attempt, per
``kv_load_failure_policy``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tetriserve.common import log_context
from tetriserve.common.config import ClusterConfig, DecodeConfig
from tetriserve.common.cost_estimator import CostEstimator, load_estimator
from tetriserve.common.cost_profile import default_profile_path
from tetriserve.common.decisions import as_settings
from tetriserve.common.engine_tags import EngineTags
from tetriserve.common.length import LengthEstimate
from tetriserve.common.load import DecodeLoad, PrefillLoad
from tetriserve.common.request import Request, RequestState
from tetriserve.common.stream import FinishReason, TokenLogprobs
from tetriserve.decode_worker.admission import AdmissionPolicy
from tetriserve.decode_worker.moves import DecodePeer, Move, SliceMover
from tetriserve.decode_worker.policy import decode_policies, decode_policy_settings, updated_decode_config
from tetriserve.decode_worker.preemption import PreemptionOrder, PreemptionStrategy
from tetriserve.decode_worker.role import decode_role, snapshot_of
from tetriserve.decode_worker.slices import Order
from tetriserve.decode_worker.spans import NO_SPANS, DecodeSpans
from tetriserve.engine.core_layout import CoreLayout, RoleCpu, claim_decode_cores
from tetriserve.engine.hardware import detect_hardware
from tetriserve.engine.loop_messages import Delta, InlineSink
from tetriserve.engine.worker_base import EngineWorker, build_worker_engine
from tetriserve.observability import tracing
from tetriserve.transport.instructions import KVInstruction, KVMode

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)


class _DecodeRole(Protocol):
    """What installing the policies sets on the engine's decode scheduler (``TetriDecodeScheduler``)."""

    slice_iters: int

    def configure(
        self,
        policy: AdmissionPolicy,
        order: PreemptionOrder | None = None,
        strategy: PreemptionStrategy | None = None,
    ) -> None: ...


@dataclass
class Running:
    request: Request
    subscriber: str  # the front door whose stream gets its tokens
    heavy: bool
    generated: list[int] = field(default_factory=list)  # every output token so far, the prefill's first too
    base: int = 0  # of those, the ones its engine request has as prompt (generated before it started here)
    kv_key: str | None = None  # where its KV arrives (the request id from prefill, ``move:...`` after a move)
    move: Move | None = None
    task: asyncio.Task[None] | None = None  # a slice hand-over, or (colocated) a wait for the prediction
    decoding: bool = False  # produced a token on this worker
    spans: DecodeSpans = NO_SPANS  # its spans here (tracing on only)

    @property
    def estimate(self) -> LengthEstimate | None:
        """Its length estimate, which lives on the request (a late prediction replaces it, ``refine``)."""
        return self.request.length_estimate

    @property
    def computing_prompt(self) -> bool:
        """Its prompt is computed here, no KV coming (an offloaded prompt, a recompute), until its next token."""
        return self.kv_key is None and not self.decoding


class DecodeWorker(EngineWorker):
    decode_cost: CostEstimator | None = None  # the cost models sola admission reads (SOLA eq. 4), if a profile is
    _cost_profile: Path | None = None  # this model's cost profile on this hardware (the scls estimator's)

    def __init__(
        self,
        worker_id: str,
        config: ClusterConfig,
        model_path: str,
        incarnation: int = 0,
        predecessor: EngineWorker | None = None,
    ) -> None:
        """``predecessor``: the prefill role this worker played until a flip; its engine decodes now."""
        super().__init__(worker_id, config, incarnation, predecessor)
        if predecessor is None:
            self.engine = build_worker_engine(config, model_path, worker_id)
        self._decode_cfg = config.decode
        self.decode_cost = self._decode_cost(config, model_path)
        # where the scls admission policy finds its fitted estimator unless the config names a profile
        self._cost_profile = default_profile_path(model_path, detect_hardware())
        engine = config.engine
        layout = CoreLayout.from_env()
        self.core_claim = None if layout is None else claim_decode_cores(layout, engine.threads_per_engine)
        placement = engine.placement()
        cpu = RoleCpu.decode(placement, layout, self.core_claim)
        self.engine.take_role(
            self._first_installer(config.decode),
            lambda s: decode_role(s).snapshot(),
            niceness=cpu.niceness,
            borrows=cpu.borrows,
            borrow_min_batch=placement.borrow_min_batch,
            borrow_min_idle=placement.borrow_min_idle_cores,
            cores=cpu.cores,
        )
        self.accepting = True
        self.running: dict[str, Running] = {}
        self.mover = SliceMover(self)

    def _decode_cost(self, config: ClusterConfig, model_path: str) -> CostEstimator | None:
        """The cost profile's models, with a decode correction of this worker's own (SOLA eq. 4–5), when a
        profile is configured or this model's default one exists."""
        from tetriserve.engine.hardware import detect_hardware

        return load_estimator(config.prefill.cost_profile, model_path, detect_hardware(), config.prefill.cost_alpha)

    def load(self) -> PrefillLoad | DecodeLoad:  # a colocated worker's is a PrefillLoad (worker/colocated.py)
        s = self.engine.stats()
        snap = snapshot_of(self.engine.snapshot.extra)
        heavy = sum(1 for r in self.running.values() if r.heavy)
        return DecodeLoad(
            self.worker_id,
            s.free_blocks,
            s.total_blocks,
            s.block_size,
            s.running,
            s.waiting,
            heavy,
            len(self.running) - heavy,
            time.time(),
            self.accepting,
            snap.remaining_tokens if snap is not None else 0,
            snap.step_s if snap is not None else 0.0,  # 0 while nothing runs
            self._decode_cfg.slice_iters,
            self.incarnation,
            self.engine.steps,
            self.engine.in_flight > 0,
            max(0, self._decode_cfg.max_local_prompts - self.prompts_here()),
        )

    def prompts_here(self) -> int:
        return sum(1 for r in self.running.values() if r.computing_prompt)

    def policies(self) -> dict[str, str]:
        """The settings ``set_policy`` takes, by the same names, the preemption counters and the time admission
        takes."""
        snap = snapshot_of(self.engine.snapshot.extra)
        engine = {**snap.preemption, **snap.admission_cost} if snap is not None else {}
        stats = {**engine, **self.mover.counts.summary()}
        return {**decode_policy_settings(self._decode_cfg), **stats, **as_settings(self.decisions())}

    def decisions(self) -> dict[str, dict[str, int]]:
        snap = snapshot_of(self.engine.snapshot.extra)
        return {p: dict(c) for p, c in snap.decisions.items()} if snap is not None else {}

    async def set_policy(self, changes: Mapping[str, object]) -> dict[str, str]:
        """Admin RPC: switch admission, preemption order, swap-or-recompute or slices at run time.

        ``changes`` are ``DecodeConfig`` fields; all policies are built before any is
        installed, so a bad value (ValueError naming the setting) changes nothing.
        """
        cfg = updated_decode_config(self._decode_cfg, changes)
        install = self._installer(cfg)
        await self.engine.call(lambda s: install(decode_role(s)))
        self._decode_cfg = cfg  # what the policies were last built from
        logger.info("decode %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    def _installer(self, cfg: DecodeConfig) -> Callable[[_DecodeRole], None]:
        """Build ``cfg``'s policies now (a ValueError changes nothing); the returned function installs them
        in the engine's decode scheduler, on the engine thread."""
        policies = decode_policies(cfg, self.decode_cost, self._cost_profile)

        def install(scheduler: _DecodeRole) -> None:
            scheduler.configure(*policies)
            scheduler.slice_iters = cfg.slice_iters

        return install

    def _first_installer(self, cfg: DecodeConfig) -> Callable[[Scheduler], None]:
        """``_installer``'s, first making the engine's scheduler, whatever role it played, the decode role's
        (a colocated worker's: its own, ``worker/colocated.py``)."""
        install = self._installer(cfg)

        def assume(scheduler: Scheduler) -> None:
            from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler

            decode = TetriDecodeScheduler.assume(scheduler)
            decode.on_preemption = self.preemption_seen
            install(decode)

        return assume

    def preemption_seen(self, request_id: str, what: str) -> None:
        """On the engine thread: ``request_id`` was preempted (``what`` "preempted") or decodes again
        ("resumed"); recorded as its state (CacheOpt §3.4's preemptions, visible in the request's events)."""
        state = RequestState.PREEMPTED if what == "preempted" else RequestState.DECODING
        self.engine_event(request_id, state, f"{what} on {self.worker_id}")

    # -- the request path -------------------------------------------------------------
    async def take(
        self,
        req: Request,
        generated: tuple[int, ...],
        subscriber: str,
        pull_from: str | None = None,
        prefill_here: bool = False,
    ) -> bool:
        """Start decoding ``req`` after ``generated`` (the prefill's token; before it, for a migrated request, the
        tokens the client already had), whose KV is (or will be) pushed here under ``req.kv_key``, or pulled: from
        ``pull_from`` (a prefill worker of this host), or by a pull under way (``pull_kv``). ``prefill_here``: a
        prompt offloaded by a prefill worker (backlogged, ``prefill.offload_wait_s``, or short,
        ``prefill.offload_max_tokens``): no KV comes, this engine computes it; refused while
        ``decode.max_local_prompts`` are being computed here."""
        if prefill_here and self.prompts_here() >= self._decode_cfg.max_local_prompts:
            return False
        if not self._may_take(req):
            return False
        arrived = tracing.now_ns()
        pulled = not prefill_here and await self.pulled(req.kv_key, pull_from)
        run = self._track(req, subscriber, list(generated), arrived, pulled)
        self._start(run, None if prefill_here else req.kv_key)  # None: no KV comes, the engine computes the prompt
        return True

    def _may_take(self, req: Request) -> bool:
        """Whether ``req`` may start here; an earlier attempt of it that is still here is aborted first."""
        held = self.running.get(req.request_id)
        if not self.accepting or (held is not None and held.request.attempt >= req.attempt):
            return False
        if held is not None:
            self.abort(req.request_id, held.request.attempt)
        return True

    def holding(self, subscriber: str) -> tuple[tuple[str, int], ...]:
        return tuple((rid, run.request.attempt) for rid, run in self.running.items() if run.subscriber == subscriber)

    async def refine(self, request_id: str, attempt: int, estimate: LengthEstimate) -> bool:
        """The length prediction of a request that was handed here with the predictor's instant estimate, because
        the prediction was not ready yet (``prefill_worker/predictions.py``): policies use it from now on."""
        run = self.running.get(request_id)
        if run is None or run.request.attempt != attempt:
            return False  # finished, moved on, or a later attempt is here
        self._estimated(run, estimate)
        after = estimate.after(run.base - 1)
        return await self.engine.call(lambda s: decode_role(s).retag(request_id, after))

    def _estimated(self, run: Running, estimate: LengthEstimate) -> None:
        """``estimate`` is ``run``'s request's from now on (the engine's tags are the caller's to update)."""
        run.request.length_estimate = estimate
        run.heavy = estimate.is_heavy(self.config.prefill.heavy_threshold_tokens)

    async def adopt(self, req: Request, generated: tuple[int, ...], key: str, subscriber: str) -> bool:
        """Go on decoding a request moved here at a slice boundary (SCLS §7): ``generated`` is every token it
        has produced so far; the KV of all but the last is (or will be) pushed here under ``key``."""
        if not self._may_take(req):
            return False
        self.mover.counts.moved_in += 1
        self._start(self._track(req, subscriber, list(generated)), key)
        self.event(req.request_id, RequestState.DECODE_QUEUED)
        return True

    def _track(
        self,
        req: Request,
        subscriber: str,
        generated: list[int],
        arrived_ns: int | None = None,
        pulled: bool = False,
    ) -> Running:
        estimate = req.length_estimate
        heavy = estimate is not None and estimate.is_heavy(self.config.prefill.heavy_threshold_tokens)
        run = Running(req, subscriber, heavy, generated)
        run.spans = DecodeSpans.open(self.worker_id, req, len(generated), arrived_ns, pulled)
        self.running[req.request_id] = run
        return run

    def _start(self, run: Running, key: str | None) -> None:
        """Put ``run`` on the engine: prompt and tokens so far, the KV of all but the last loaded from ``key``
        through the connector (None: recompute it)."""
        from tetriserve.engine.sampling import to_vllm

        req = run.request
        run.kv_key = key
        run.decoding = False
        run.base = len(run.generated)
        prompt = (*req.prompt_token_ids, *run.generated)
        kv = KVInstruction(KVMode.RECV, key, len(prompt) - 1) if key is not None else None
        tags = EngineTags(  # for the decode scheduler, which knows the request by a suffixed id
            request_id=req.request_id,
            tbt_slo_s=req.slo.tbt_ms / 1e3 if req.slo.tbt_ms is not None else None,
            # the prompt side's inputs on a colocated engine (AccelGen's remaining time §4.3, SOLA's state §4.3)
            arrival=req.arrival_time,
            ttft_slo_s=req.slo.ttft_ms / 1e3 if req.slo.ttft_ms is not None else None,
            jct_slo_s=req.slo.jct_ms / 1e3 if req.slo.jct_ms is not None else None,
            # as on first submit, counted from the prefill's token on
            estimate=run.estimate.after(run.base - 1) if run.estimate is not None else None,
        )
        left = req.sampling.max_tokens - len(run.generated)
        params = to_vllm(req.sampling, max_tokens=left, prior_outputs=len(run.generated), kv=kv, tags=tags)
        if key is not None:
            tracing.link_key(key, run.spans.span)  # the KV connector's load span goes under it
        on_delta = log_context.within(req.request_id, req.trace, functools.partial(self._on_delta, run))
        run.spans.queued()
        inline = InlineSink(
            functools.partial(self._tokens_now, run, asyncio.get_running_loop()), self.streams.send_staged
        )
        self.engine.add(req.kv_key, prompt, params, on_delta, run.spans.on_added, inline)

    def _tokens_now(self, run: Running, loop: asyncio.AbstractEventLoop, delta: Delta) -> bool:
        """On the engine thread: a step's tokens for ``run`` that do not finish it go to its front door's stream
        from there (``StreamHub.stage``), without a turn of this actor's event loop; always True."""
        if not delta.token_ids or self.running.get(run.request.request_id) is not run:
            return True  # nothing to send, or not this stream's now (as ``_on_delta`` would drop it)
        index = len(run.generated)
        chunk = self.chunk(run.request, delta.token_ids, index, logprobs=delta.logprobs)
        run.generated.extend(delta.token_ids)
        self.streams.stage(run.subscriber, chunk)
        if not run.decoding:
            run.decoding = True
            loop.call_soon_threadsafe(self._decoding, run)
        return True

    def _decoding(self, run: Running) -> None:
        run.spans.first_token()
        self.event(run.request.request_id, RequestState.DECODING)

    def _on_delta(self, run: Running, delta: Delta) -> None:
        """One engine step's output for ``run`` (on the actor's event loop): its finish, and what the engine
        thread did not send itself (``_tokens_now``)."""
        rid = run.request.request_id
        if self.running.get(rid) is not run:  # evicted, or replaced by a later attempt: not this stream's now
            return
        index = len(run.generated)
        run.generated.extend(delta.token_ids)
        if delta.token_ids and not run.decoding:
            run.decoding = True
            self._decoding(run)
        if delta.finish_reason == "length" and run.move is not None and not self._at_end(run):
            if delta.token_ids:  # the slice's last token; the request goes on elsewhere
                self._publish(run, delta.token_ids, index=index, logprobs=delta.logprobs)
            run.task = asyncio.create_task(self.mover.hand_over(run, run.move, self._start))
            return
        reason = FinishReason(delta.finish_reason) if delta.finish_reason is not None else None
        # an engine error (a failed KV load under the "fail" policy, a failed step) is ours, not the request's
        retry = reason is FinishReason.ERROR
        self._publish(run, delta.token_ids, reason, delta.error, index=index, retry=retry, logprobs=delta.logprobs)

    def _at_end(self, run: Running) -> bool:
        """Whether a ``length`` finish is the request's own (its cap or the context limit), not a slice cut."""
        total = len(run.request.prompt_token_ids) + len(run.generated)
        return len(run.generated) >= run.request.sampling.max_tokens or total >= self.config.engine.max_model_len

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
        req = run.request
        self.publish(
            run.subscriber, req, tokens, reason, error, index=index, moved_to=moved_to, retry=retry, logprobs=logprobs
        )
        if reason in (FinishReason.STOP, FinishReason.LENGTH) and not retry:
            self.length_score.observe(run.estimate, len(run.generated))
        if reason is not None:
            run.spans.close(len(run.generated), reason, error)
            if self.running.get(req.request_id) is run:
                del self.running[req.request_id]
            if run.move is not None:  # finished at its boundary: its parked KV goes
                self.endpoint.discard(run.move.key)

    def moved_away(self, run: Running, dst: str, handle: DecodePeer) -> None:
        """``run`` has been taken over by ``dst`` (slice move): its stream goes on from there."""
        rid = run.request.request_id
        self.running.pop(rid, None)
        self.handed_on(rid, handle)
        self._publish(run, (), index=len(run.generated), moved_to=dst)
        run.spans.close(len(run.generated), None, None, moved_to=dst)
        self.event(rid, RequestState.TRANSFERRING, f"{self.worker_id} -> {dst}", moved_to=dst)

    # -- SCLS slice moves ------------------------------------------------------------
    async def rebalance(self, order: Order, address: str, handle: DecodePeer) -> list[str]:
        """ClusterMonitor's round (SCLS §4.5): mark requests to move to ``order.dst`` at their next boundary."""
        return await self.mover.rebalance(order, address, handle, self._decode_cfg.slice_iters)

    # -- aborts ---------------------------------------------------------------------------
    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        """Stop decoding; the request's stream ends with an ``abort`` chunk. A request that has moved on is
        aborted where it went. ``attempt``: only that attempt (None: whichever is here)."""
        run = self.running.get(request_id)
        if run is None or (attempt is not None and run.request.attempt != attempt):
            if attempt is not None:  # its KV may still be on its way
                self.endpoint.discard(Request.key_of(request_id, attempt))
            return self.forward_abort(request_id, attempt)
        if run.kv_key is not None:  # not loaded yet, or a late arrival: dropped on landing
            self.endpoint.discard(run.kv_key)
        if run.move is not None:
            self.endpoint.discard(run.move.key)
        if run.task is not None and not run.task.done():  # between engines (slice hand-over), or not started
            run.task.cancel()
            self._publish(run, (), FinishReason.ABORT, index=len(run.generated))
        self.engine.abort(run.request.kv_key)
        return True

    # -- flips ---------------------------------------------------------------------------
    def idle(self) -> bool:
        return not self.running and self.engine.in_flight == 0

    def retire(self) -> None:
        super().retire()
        if self.core_claim is not None:  # the next role's engine thread runs elsewhere; another decode may claim
            self.core_claim.release()

    def evict(self, error: str) -> int:
        held = list(self.running.values())
        for run in held:
            if run.task is not None:
                run.task.cancel()
            if run.kv_key is not None:
                self.endpoint.discard(run.kv_key)
            self.engine.abort(run.request.kv_key)
            self._publish(run, (), FinishReason.ERROR, error, index=len(run.generated), retry=True)  # off the books
        return len(held)

    def _subscriber_gone(self, subscriber: str) -> None:
        for rid in [rid for rid, run in self.running.items() if run.subscriber == subscriber]:
            self.abort(rid)
