"""Counters taken from vLLM's own per-step stats (a ``StatLoggerBase`` plugged into the engine).

These are the engine's numbers, not ours: ``prompt_tokens_computed`` is what the
engine really prefilled, ``prompt_tokens_external`` what the KV connector
supplied. The disaggregation test asserts the decode engine's computed count
stays at one token per request (the first generated token, fed back as input).
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase, StatLoggerFactory
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


@dataclass(frozen=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    total_blocks: int = 0
    block_size: int = 0
    steps: int = 0  # engine steps taken (``EngineLoop``'s count, published with ``step_seconds``)
    prompt_tokens_total: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_external: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    step_seconds: float = 0.0  # wall time spent inside engine steps (``EngineLoop``'s, not vLLM's)
    step_cpu_seconds: float = 0.0  # the stepping thread's own CPU time inside them
    borrowed_steps: int = 0  # steps taken with cores borrowed from idle engines (``engine/cores.py``)
    step_sleeps: int = 0  # times the stepping thread slept inside them: its process's interpreter lock, mostly
    step_preemptions: int = 0  # times it was preempted inside them (another thread took its core)

    @property
    def free_blocks(self) -> int:
        return round(self.total_blocks * (1.0 - self.kv_usage))


class StatsCollector:
    """Accumulates vLLM scheduler/iteration stats; read from any thread via ``snapshot``."""

    def __init__(self, total_blocks: int = 0, block_size: int = 0) -> None:
        self._lock = threading.Lock()
        self._stats = EngineStats(total_blocks=total_blocks, block_size=block_size)

    def set_capacity(self, total_blocks: int, block_size: int) -> None:
        with self._lock:
            self._stats = replace(self._stats, total_blocks=total_blocks, block_size=block_size)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        with self._lock:
            s = self._stats
            if scheduler_stats is not None:
                s = replace(
                    s,
                    running=scheduler_stats.num_running_reqs,
                    waiting=scheduler_stats.num_waiting_reqs,
                    kv_usage=float(scheduler_stats.kv_cache_usage),
                )
            if iteration_stats is not None:
                p = iteration_stats.prompt_token_stats
                s = replace(
                    s,
                    prompt_tokens_total=s.prompt_tokens_total + p.total,
                    prompt_tokens_computed=s.prompt_tokens_computed + p.computed,
                    prompt_tokens_cached=s.prompt_tokens_cached + p.local_cache_hit,
                    prompt_tokens_external=s.prompt_tokens_external + p.external_kv_transfer,
                    generation_tokens=s.generation_tokens + iteration_stats.num_generation_tokens,
                    preemptions=s.preemptions + iteration_stats.num_preempted_reqs,
                )
            self._stats = s

    def mark_idle(self) -> None:
        """The engine has no unfinished request: nothing runs or waits (KV usage is read live from the pool)."""
        with self._lock:
            self._stats = replace(self._stats, running=0, waiting=0)

    def snapshot(self) -> EngineStats:
        with self._lock:
            return self._stats


def stat_loggers(collector: StatsCollector) -> list[StatLoggerFactory]:
    """The ``stat_loggers`` of a worker's ``LLMEngine``: ``collector``'s, and a stand-in that keeps vLLM from
    adding its own Prometheus logger, whose per-step ``record`` fills a registry in the worker's process that
    nothing scrapes (the front door exports the workers' ``stats()``), work that shows in a sampled profile of
    every served decode step. vLLM's periodic log line stays."""
    return [stat_logger_factory(collector), _unscraped_prometheus()]


def _unscraped_prometheus() -> type[PrometheusStatLogger]:
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class _Unscraped(PrometheusStatLogger):  # vLLM adds its own unless a PrometheusStatLogger is among the custom
        def __init__(self, vllm_config: VllmConfig, engine_indexes: list[int] | None = None) -> None:
            return  # nothing registered with prometheus_client

        def record(self, *args: object, **kwargs: object) -> None:
            return

        def record_sleep_state(self, *args: object, **kwargs: object) -> None:
            return

        def record_admission_rejection(self, *args: object, **kwargs: object) -> None:
            return

        def log_engine_initialized(self) -> None:
            return

        def log(self) -> None:
            return

    return _Unscraped


def stat_logger_factory(collector: StatsCollector) -> type[StatLoggerBase]:
    """A vLLM ``StatLoggerFactory`` that forwards every record to ``collector``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            collector.set_capacity(vllm_config.cache_config.num_gpu_blocks or 0, vllm_config.cache_config.block_size)

        def record(
            self,
            scheduler_stats: SchedulerStats | None,
            iteration_stats: IterationStats | None,
            *args: object,
            **kwargs: object,
        ) -> None:
            collector.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return

    return _Logger


def thread_switches() -> tuple[int, int]:
    """The calling thread's context switches so far: (voluntary: it slept, involuntary: it was preempted);
    zeros where the OS keeps no per-thread count (``RUSAGE_THREAD`` is Linux's)."""
    if _RUSAGE_THREAD is None:
        return 0, 0
    usage = resource.getrusage(_RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw
