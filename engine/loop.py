"""Drive one in-process vLLM ``LLMEngine`` from a thread; hand outputs to asyncio callers.

    actor coroutine ──generate()──▶ command queue ──▶ engine thread: add/abort, engine.step()
          ▲                                                 │
          └────── asyncio.Queue per request ◀──call_soon_threadsafe── per-step token deltas

The engine thread blocks on the command queue when idle and never waits on a
transfer: requests whose KV is still in flight sit in vLLM's
WAITING_FOR_REMOTE_KVS state while the loop keeps stepping (with a 1 ms pause
on steps that produced nothing, so a waiting engine does not burn a core).
A failure inside ``step`` finishes every in-flight request with an error and
the loop goes on serving new ones.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.stats import EngineStats, StatsCollector, stat_logger_factory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    """New output tokens of one request in one engine step."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Delta]

    def put(self, delta: Delta) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, delta)


class EngineLoop:
    def __init__(self, engine_args: Any, name: str) -> None:
        from vllm.v1.engine.llm_engine import LLMEngine

        self.name = name
        self.collector = StatsCollector()
        self.engine = LLMEngine.from_engine_args(engine_args, stat_loggers=[stat_logger_factory(self.collector)])
        cache = self.engine.vllm_config.cache_config
        self.collector.set_capacity(cache.num_gpu_blocks or 0, cache.block_size)
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._sinks: dict[str, _Sink] = {}
        self._stale = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    def stats(self) -> EngineStats:
        """vLLM's per-step counters, with KV usage read live from the engine's block pool."""
        snap = self.collector.snapshot()
        usage = self.block_pool_usage()
        return snap if usage is None else replace(snap, kv_usage=usage)

    def scheduler(self) -> Any:
        """The engine's vLLM scheduler (an in-process engine's; our ``scheduler_cls`` when one was given)."""
        return self.engine.engine_core.engine_core.scheduler

    def block_pool_usage(self) -> float | None:
        """Share of KV blocks held by requests, from vLLM's block pool (in-process engines); None if unreachable."""
        try:
            pool = self.engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
            return float(pool.get_usage())
        except AttributeError:
            return None

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], params: Any) -> AsyncIterator[Delta]:
        """Run one request; yields deltas until one carries ``finish_reason``. Closing early aborts it."""
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.DELTA
        sink = _Sink(asyncio.get_running_loop(), asyncio.Queue())
        if request_id in self._sinks:
            raise ValueError(f"request id {request_id} is already running on {self.name}")
        self._sinks[request_id] = sink
        self._commands.put(("add", (request_id, list(prompt_token_ids), params)))
        finished = False
        try:
            while not finished:
                delta = await sink.queue.get()
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    # -- engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:  # daemon thread: lives as long as the worker process
            busy = self.engine.has_unfinished_requests()
            self._drain(block=not busy)
            if not self.engine.has_unfinished_requests():
                if self._stale:  # vLLM reports stats only from steps; an idle engine holds nothing
                    self._stale = False
                    self.collector.mark_idle()
                continue
            self._step_once()

    def _step_once(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # engine bug: fail what is in flight, keep serving
            logger.exception("engine %s: step failed", self.name)
            self._fail_all(f"engine step failed: {exc}")
            return
        self._stale = True
        for out in outputs:
            self._deliver(out)
        if not outputs:
            time.sleep(0.001)

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, arg: Any) -> None:
        if kind == "add":
            request_id, prompt, params = arg
            try:
                self.engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            except Exception as exc:  # rejected by vLLM's own validation
                sink = self._sinks.pop(request_id, None)
                if sink is not None:
                    sink.put(Delta((), "error", f"{type(exc).__name__}: {exc}"))
        elif kind == "abort":
            sink = self._sinks.pop(arg, None)
            if sink is not None:
                self.engine.abort_request([arg])
                sink.put(Delta((), "abort"))

    def _deliver(self, out: Any) -> None:
        sink = self._sinks.get(out.request_id)
        if sink is None:
            return
        completion = out.outputs[0] if out.outputs else None
        tokens = tuple(completion.token_ids) if completion is not None else ()
        reason = None
        if out.finished:
            reason = (completion.finish_reason if completion is not None else None) or "stop"
            del self._sinks[out.request_id]
        error = "KV cache transfer failed" if reason == "error" else None
        sink.put(Delta(tokens, reason, error))

    def _fail_all(self, error: str) -> None:
        ids = list(self._sinks)
        for request_id in ids:
            self._sinks.pop(request_id).put(Delta((), "error", error))
        try:
            self.engine.abort_request(ids)
        except Exception:
            logger.exception("engine %s: abort after failure also failed", self.name)
