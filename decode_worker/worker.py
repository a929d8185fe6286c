"""DecodeWorker: one decode instance (TetriInfer §3.4), run as a named Ray actor.

    submit(req, first_token) ─▶ vLLM engine (prompt + first token, KV expected from the connector)
                                  │ request waits in WAITING_FOR_REMOTE_KVS until its KV has landed,
                                  │ then only the first token's KV is computed; continuous batching
                                  ▼
    subscribe() ◀── one Outbox for all requests: each pull carries every delta ready ──▶ GlobalScheduler

``submit`` returns at once. Outputs of every request go to the worker's one
``Outbox``, which the GlobalScheduler drains through a single long-lived
``subscribe`` stream, so relaying costs one message per engine step rather
than one per request per step. Admission (``decode.admission_policy``), the preemption
victim order and swap-or-recompute (``decode.preemption_order`` / ``_mode``) are
decided in the engine's scheduler subclass (``vllm_scheduler.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from common.config import ClusterConfig, DecodeConfig
from common.length import LengthEstimate
from common.load import DecodeLoad
from common.outbox import Outbox
from common.request import Request
from common.stream import StreamChunk
from decode_worker.policy import EXTRA_KEY, LENGTH_KEY, decode_policies
from engine.settings import EngineRole, build_engine_args
from engine.worker_base import EngineWorker

logger = logging.getLogger(__name__)

SCHEDULER_CLS = "decode_worker.vllm_scheduler.TetriDecodeScheduler"


@dataclass
class _Running:
    request: Request
    heavy: bool
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
        self._decode_cfg = config.decode  # what the policies were last built from (``set_policy``)
        self.engine.scheduler().configure(*decode_policies(config.decode))
        self.accepting = True
        self._running: dict[str, _Running] = {}
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
        )

    def policies(self) -> dict[str, str]:
        """The settings ``set_policy`` takes, by the same names, and the preemption counters."""
        return {**decode_policy_settings(self._decode_cfg), **self.engine.scheduler().stats.summary()}

    def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        """Admin RPC: switch admission, preemption order or swap-or-recompute at run time.

        ``changes`` are ``DecodeConfig`` fields; all policies are built before any is
        installed, so a bad value (ValueError naming the setting) changes nothing.
        """
        cfg = updated_decode_config(self._decode_cfg, changes)
        admission, order, strategy = decode_policies(cfg)
        self.engine.scheduler().configure(admission, order, strategy)
        self._decode_cfg = cfg
        logger.info("decode %s: policy now %s", self.worker_id, self.policies())
        return self.policies()

    # -- the request path -------------------------------------------------------------
    async def submit(self, req: Request, first_token: int, estimate: LengthEstimate | None) -> bool:
        """Start decoding ``req`` whose prompt KV is (or will be) pushed here under key ``request_id``."""
        from engine.sampling import to_vllm

        if not self.accepting or req.request_id in self._running:
            return False
        heavy = estimate is not None and estimate.is_heavy(self.config.prefill.heavy_threshold_tokens)
        run = _Running(req, heavy)
        self._running[req.request_id] = run
        kv = {"mode": "recv", "key": req.request_id, "num_tokens": len(req.prompt_token_ids)}
        extra: dict[str, Any] = {}  # for the decode scheduler
        if estimate is not None:
            extra[LENGTH_KEY] = estimate.to_dict()
        if req.slo.tbt_ms is not None:
            extra[EXTRA_KEY] = {"tbt_slo_s": req.slo.tbt_ms / 1e3}
        params = to_vllm(req.sampling, max_tokens=req.sampling.max_tokens - 1, kv_params=kv, extra=extra or None)
        prompt = (*req.prompt_token_ids, first_token)
        run.task = asyncio.create_task(self._pump(run, prompt, params))
        run.task.add_done_callback(functools.partial(self._on_pump_done, run))
        return True

    def _on_pump_done(self, run: _Running, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # aborted, perhaps before the pump ever ran: end the stream explicitly
            self._emit(StreamChunk(run.request.request_id, (), "abort", None, 0, self.worker_id))

    async def _pump(self, run: _Running, prompt: tuple[int, ...], params: Any) -> None:
        rid = run.request.request_id
        prompt_len = len(run.request.prompt_token_ids)
        try:
            async for delta in self.engine.generate(rid, prompt, params):
                self._emit(
                    StreamChunk(rid, delta.token_ids, delta.finish_reason, delta.error, prompt_len, self.worker_id)
                )
        except Exception as exc:  # a bug in our adapter: finish the request, keep the worker
            logger.exception("decode %s: request %s failed", self.worker_id, rid)
            self._emit(StreamChunk(rid, (), "error", f"{type(exc).__name__}: {exc}", prompt_len, self.worker_id))

    def _emit(self, chunk: StreamChunk) -> None:
        if chunk.finish_reason is not None:
            self._running.pop(chunk.request_id, None)
        self.outbox.put(chunk)

    async def subscribe(self) -> Any:
        """The GlobalScheduler's one stream from this worker: batches of chunks of all requests."""
        async for batch in self.outbox.batches():
            yield batch

    def abort(self, request_id: str) -> bool:
        """Stop decoding; the request's stream (attached or not yet) ends with an ``abort`` chunk."""
        self.endpoint.discard(request_id)
        run = self._running.get(request_id)
        if run is None:
            return False
        if run.task is not None and not run.task.done():
            run.task.cancel()
        self.engine.abort(request_id)
        return True

    def discard(self, key: str) -> None:
        """Drop KV pushed for a request that will not decode here (finished at prefill, aborted)."""
        self.endpoint.discard(key)
