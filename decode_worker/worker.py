"""DecodeWorker: one decode instance (TetriInfer §3.4), run as a named Ray actor.

    submit(req, first_token) ─▶ vLLM engine (prompt + first token, KV expected from the connector)
                                  │ request waits in WAITING_FOR_REMOTE_KVS until its KV has landed,
                                  │ then only the first token's KV is computed; continuous batching
                                  ▼
    subscribe() ◀── one Outbox for all requests: each pull carries every delta ready ──▶ GlobalScheduler

    SCLS slices (§7; ``decode.slice_iters`` > 0), ordered by the ClusterMonitor's rebalancing round:
    rebalance(order) ─▶ marks the requests ``slices.pick_movers`` chooses; each ends at its next slice
    boundary with its KV parked ─▶ send KV to the destination's endpoint ─▶ destination.adopt(...) ─▶
    a ``moved_to`` marker in this worker's stream tells the GlobalScheduler where the rest comes from.
    A destination that refuses (or a send that cannot start) leaves the request here: it resumes
    from its own parked KV.

``submit`` returns at once. Outputs of every request go to the worker's one
``Outbox``, which the GlobalScheduler drains through a single long-lived
``subscribe`` stream, so relaying costs one message per engine step rather
than one per request per step. Admission (``decode.admission_policy``), the preemption
victim order and swap-or-recompute (``decode.preemption_order`` / ``_mode``) are
decided in the engine's scheduler subclass (``vllm_scheduler.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from common.config import ClusterConfig, DecodeConfig
from common.length import LengthEstimate
from common.load import DecodeLoad
from common.outbox import Outbox
from common.request import Request
from common.stream import StreamChunk
from decode_worker.policy import EXTRA_KEY, LENGTH_KEY, decode_policies
from decode_worker.slices import Order, SliceMoves, pick_movers
from engine.settings import EngineRole, build_engine_args
from engine.worker_base import EngineWorker

logger = logging.getLogger(__name__)

SCHEDULER_CLS = "decode_worker.vllm_scheduler.TetriDecodeScheduler"
MOVED_MEMORY = 4096  # moved-away requests remembered, to forward a late abort to where they went


@dataclass(frozen=True)
class _Move:
    key: str  # its KV is parked under this at the slice boundary
    dst: str
    address: str
    handle: Any


@dataclass
class _Running:
    request: Request
    heavy: bool
    estimate: LengthEstimate | None
    generated: list[int] = field(default_factory=list)  # every output token so far, the prefill's first too
    kv_key: str | None = None  # where its KV arrives (the request id from prefill, ``move:...`` after a move)
    move: _Move | None = None
    task: asyncio.Task[None] | None = None


def updated_decode_config(cfg: DecodeConfig, changes: dict[str, Any]) -> DecodeConfig:
    """``cfg`` with ``changes`` applied and validated; a ValueError names every bad ``decode.<field>``."""
    try:
        return DecodeConfig.model_validate({**cfg.model_dump(), **changes})
    except ValidationError as exc:
        bad = "; ".join(f"decode.{'.'.join(map(str, e['loc'])) or 'changes'}: {e['msg']}" for e in exc.errors())
        raise ValueError(bad) from None


def decode_policy_settings(cfg: DecodeConfig) -> dict[str, str]:
    """The policy settings in force, as ``policy show`` lists them (cacheopt's knobs only under cacheopt)."""
    shown = cfg.model_dump(exclude_none=True)
    if cfg.admission_policy != "cacheopt":
        shown = {k: v for k, v in shown.items() if not k.startswith("cacheopt_")}
    return {k: str(v) for k, v in shown.items()}


class DecodeWorker(EngineWorker):
    def __init__(self, worker_id: str, config: ClusterConfig, model_path: str) -> None:
        from engine.loop import EngineLoop

        super().__init__(worker_id, config)
        args = build_engine_args(
            config.engine,
            model_path,
            EngineRole.DECODE,
            endpoint=worker_id,
            transport=config.transport,
            kv_deadline_s=config.kv_transfer_timeout_s,
            scheduler_cls=SCHEDULER_CLS,
        )
        self.engine = EngineLoop(args, worker_id)
        self._install(config.decode)
        self.accepting = True
        self._running: dict[str, _Running] = {}
        self._moved: OrderedDict[str, Any] = OrderedDict()  # request id -> handle of the worker it moved to
        self.moves = SliceMoves()
        self._move_keys = itertools.count()  # each parked slice its own key
        self.outbox = Outbox()

    def load(self) -> DecodeLoad:
        s = self.engine.stats()
        heavy = sum(1 for r in self._running.values() if r.heavy)
        return DecodeLoad(
            self.worker_id,
            s.free_blocks,
            s.total_blocks,
            s.block_size,
            s.running,
            s.waiting,
            heavy,
            len(self._running) - heavy,
            time.time(),
            self.accepting,
            self.engine.scheduler().remaining_tokens(),
            self.engine.scheduler().step_s if s.running else 0.0,
            self._decode_cfg.slice_iters,
        )

    def policies(self) -> dict[str, str]:
        """The settings ``set_policy`` takes, by the same names, and the preemption counters."""
        stats = {**self.engine.scheduler().stats.summary(), **self.moves.summary()}
        return {**decode_policy_settings(self._decode_cfg), **stats}

    def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        """Admin RPC: switch admission, preemption order, swap-or-recompute or slices at run time.

        ``changes`` are ``DecodeConfig`` fields; all policies are built before any is
        installed, so a bad value (ValueError naming the setting) changes nothing.
        """
        self._install(updated_decode_config(self._decode_cfg, changes))
        logger.info("decode %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    def _install(self, cfg: DecodeConfig) -> None:
        """Build ``cfg``'s policies (a ValueError changes nothing) and hand them to the engine's scheduler."""
        policies = decode_policies(cfg)
        self.engine.scheduler().configure(*policies)
        self.engine.scheduler().slice_iters = cfg.slice_iters
        self._decode_cfg = cfg  # what the policies were last built from (``set_policy``)

    # -- the request path -------------------------------------------------------------
    async def submit(self, req: Request, first_token: int, estimate: LengthEstimate | None) -> bool:
        """Start decoding ``req`` whose prompt KV is (or will be) pushed here under key ``request_id``."""
        if not self.accepting or req.request_id in self._running:
            return False
        self._start(self._track(req, estimate, [first_token]), req.request_id)
        return True

    async def adopt(self, req: Request, generated: tuple[int, ...], estimate: LengthEstimate | None, key: str) -> bool:
        """Go on decoding a request moved here at a slice boundary (SCLS §7): ``generated`` is every token it
        has produced so far; the KV of all but the last is (or will be) pushed here under ``key``."""
        if not self.accepting or req.request_id in self._running:
            return False
        self.moves.moved_in += 1
        self._start(self._track(req, estimate, list(generated)), key)
        return True

    def _track(self, req: Request, estimate: LengthEstimate | None, generated: list[int]) -> _Running:
        heavy = estimate is not None and estimate.is_heavy(self.config.prefill.heavy_threshold_tokens)
        run = _Running(req, heavy, estimate, generated)
        self._running[req.request_id] = run
        return run

    def _start(self, run: _Running, key: str | None) -> None:
        """Put ``run`` on the engine: prompt and tokens so far, the KV of all but the last loaded from ``key``
        through the connector (None: recompute it)."""
        from engine.sampling import to_vllm

        req = run.request
        run.kv_key = key
        prompt = (*req.prompt_token_ids, *run.generated)
        kv = {"mode": "recv", "key": key, "num_tokens": len(prompt) - 1} if key is not None else None
        extra: dict[str, Any] = {}  # for the decode scheduler
        if run.estimate is not None:  # as on first submit, counted from the prefill's token on
            extra[LENGTH_KEY] = run.estimate.after(len(run.generated) - 1).to_dict()
        extra[EXTRA_KEY] = {"id": req.request_id}  # vLLM's scheduler knows it by a suffixed id
        if req.slo.tbt_ms is not None:
            extra[EXTRA_KEY]["tbt_slo_s"] = req.slo.tbt_ms / 1e3
        left = req.sampling.max_tokens - len(run.generated)
        params = to_vllm(req.sampling, max_tokens=left, kv_params=kv, extra=extra)
        run.task = asyncio.create_task(self._pump(run, prompt, params))
        run.task.add_done_callback(functools.partial(self._on_pump_done, run))

    def _on_pump_done(self, run: _Running, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # aborted, perhaps before the pump ever ran: end the stream explicitly
            self._emit(StreamChunk(run.request.request_id, (), "abort", None, 0, self.worker_id))

    async def _pump(self, run: _Running, prompt: tuple[int, ...], params: Any) -> None:
        rid = run.request.request_id
        prompt_len = len(run.request.prompt_token_ids)
        try:
            async for delta in self.engine.generate(rid, prompt, params):
                run.generated.extend(delta.token_ids)
                if delta.finish_reason == "length" and run.move is not None and not self._at_end(run):
                    if delta.token_ids:  # the slice's last token; the request goes on elsewhere
                        self._emit(StreamChunk(rid, delta.token_ids, None, None, prompt_len, self.worker_id))
                    await self._hand_over(run, run.move)
                    return
                self._emit(
                    StreamChunk(rid, delta.token_ids, delta.finish_reason, delta.error, prompt_len, self.worker_id)
                )
        except Exception as exc:  # a bug in our adapter: finish the request, keep the worker
            logger.exception("decode %s: request %s failed", self.worker_id, rid)
            self._emit(StreamChunk(rid, (), "error", f"{type(exc).__name__}: {exc}", prompt_len, self.worker_id))

    def _at_end(self, run: _Running) -> bool:
        """Whether a ``length`` finish is the request's own (its cap or the context limit), not a slice cut."""
        total = len(run.request.prompt_token_ids) + len(run.generated)
        return len(run.generated) >= run.request.sampling.max_tokens or total >= self.config.engine.max_model_len

    # -- SCLS slice moves ------------------------------------------------------------
    def rebalance(self, order: Order, address: str, handle: Any) -> list[str]:
        """ClusterMonitor's round (SCLS §4.5): mark requests to move to ``order.dst`` at their next boundary."""
        slice_iters = self._decode_cfg.slice_iters
        if slice_iters <= 0 or order.src != self.worker_id or order.dst == self.worker_id:
            return []
        scheduler = self.engine.scheduler()
        # a request marked before keeps its mark (and key) until it has moved: the engine may already have
        # cut it, with its KV parked under that key, while still listing it as running
        views = [v for v in scheduler.running_views() if self._unmarked(v.request_id)]
        picked = pick_movers(views, order, slice_iters)
        for rid in picked:
            run = self._running[rid]
            run.move = _Move(f"move:{rid}:{self.worker_id}:{next(self._move_keys)}", order.dst, address, handle)
            scheduler.mark_moving(rid, run.move.key)
        if picked:
            logger.info(
                "decode %s: %d request(s) to move to %s at their slice boundary", self.worker_id, len(picked), order.dst
            )
        return picked

    def _unmarked(self, rid: str) -> bool:
        run = self._running.get(rid)
        return run is not None and run.move is None

    async def _hand_over(self, run: _Running, move: _Move) -> None:
        """The slice has ended with the KV parked under ``move.key``: continue the request on ``move.dst``,
        or here if it cannot go."""
        rid = run.request.request_id
        run.move = None
        buffers = await self.parked_kv(move.key)
        if buffers is None:
            logger.error("decode %s: parked KV %s not found; %s recomputes it", self.worker_id, move.key, rid)
        handed = False
        if buffers is not None and await self._sent(move, buffers):
            try:
                handed = await move.handle.adopt.remote(run.request, tuple(run.generated), run.estimate, move.key)
            except asyncio.CancelledError:  # aborted meanwhile: it may have been taken over there
                move.handle.abort.remote(rid)
                move.handle.discard.remote(move.key)
                raise
            except Exception:
                logger.exception("decode %s: %s could not take %s", self.worker_id, move.dst, rid)
            if not handed:
                with contextlib.suppress(Exception):  # best effort: the KV expires there anyway
                    move.handle.discard.remote(move.key)
        if handed:
            self.moves.moved_out += 1
            self._running.pop(rid, None)
            self._moved[rid] = move.handle
            while len(self._moved) > MOVED_MEMORY:
                self._moved.popitem(last=False)
            prompt_len = len(run.request.prompt_token_ids)
            self.outbox.put(StreamChunk(rid, (), prompt_tokens=prompt_len, worker=self.worker_id, moved_to=move.dst))
            return
        self.moves.kept += 1  # it goes on here, from its parked KV (recomputed if that was lost)
        if buffers is not None:
            self.endpoint.hold(move.key, buffers)
        self._start(run, move.key if buffers is not None else None)

    async def _sent(self, move: _Move, buffers: list[bytearray]) -> bool:
        """Send the parked KV to the destination and wait until it has landed there (False: it failed)."""
        from transport.api import TransferState

        handle = self.endpoint.send(move.address, move.key, buffers, self.config.kv_transfer_timeout_s)
        while handle.state is TransferState.PENDING:
            await asyncio.sleep(0.001)
        if handle.state is TransferState.FAILED:
            logger.error("decode %s: sending %s to %s failed: %s", self.worker_id, move.key, move.dst, handle.error)
            return False
        return True

    def _emit(self, chunk: StreamChunk) -> None:
        if chunk.finish_reason is not None:
            run = self._running.pop(chunk.request_id, None)
            if run is not None and run.move is not None:  # finished at its boundary: its parked KV goes
                self.endpoint.discard(run.move.key)
        self.outbox.put(chunk)

    async def subscribe(self) -> Any:
        """The GlobalScheduler's one stream from this worker: batches of chunks of all requests."""
        async for batch in self.outbox.batches():
            yield batch

    def abort(self, request_id: str) -> bool:
        """Stop decoding; the request's stream (attached or not yet) ends with an ``abort`` chunk.
        A request that has moved on is aborted where it went."""
        self.endpoint.discard(request_id)
        run = self._running.get(request_id)
        if run is not None and run.kv_key is not None:  # not loaded yet, or a late arrival: dropped on landing
            self.endpoint.discard(run.kv_key)
        if run is None:
            moved_to = self._moved.pop(request_id, None)
            if moved_to is not None:
                moved_to.abort.remote(request_id)
            return moved_to is not None
        if run.move is not None:
            self.endpoint.discard(run.move.key)
        if run.task is not None and not run.task.done():
            run.task.cancel()
        self.engine.abort(request_id)
        return True

    def discard(self, key: str) -> None:
        """Drop KV pushed for a request that will not decode here (finished at prefill, aborted)."""
        self.endpoint.discard(key)
