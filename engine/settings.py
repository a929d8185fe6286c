"""Build vLLM ``EngineArgs`` for a prefill or decode engine from the cluster config.

Each worker process runs exactly one in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the KV connector's worker half, the
transport endpoint and the worker actor share one process and one set of
counters. Environment variables that vLLM reads at import time are returned
by ``engine_env`` and must be in place before ``vllm`` is imported (the
launcher passes them as the actor's runtime_env).
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Literal, TypedDict

from tetriserve.common.config import EngineConfig, EngineDtype
from tetriserve.engine.hardware import cpu_has_bf16

if TYPE_CHECKING:
    from vllm import EngineArgs
    from vllm.v1.sample.logits_processor import LogitsProcessor

logger = logging.getLogger(__name__)

CONNECTOR_MODULE = "tetriserve.transport.kv_connector"
CONNECTOR_CLASS = "TetriKVConnector"
CPU_WORKER_CLASS = "tetriserve.engine.cpu_worker.TetriCPUWorker"  # seeded sampling over chunked prompts
PRIOR_OUTPUTS_PROCESSOR = "tetriserve.engine.prior_outputs:PriorOutputPenalties"  # disaggregated engines


class _RoleArgs(TypedDict, total=False):
    """The ``EngineArgs`` an engine's role and device add, where they apply (vLLM's defaults otherwise)."""

    logits_processors: list[str | type[LogitsProcessor]]
    scheduler_cls: str
    worker_cls: str
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float


class EngineRole(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"  # a plain vLLM engine: baselines and tests


def engine_env(cfg: EngineConfig) -> dict[str, str]:
    threads = str(cfg.threads_per_engine)
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        # vllm-cpu 0.32 saves its AOT-compiled model but cannot load it back, so with AOT compile every start
        # compiles again; Inductor's own cache does load: a (re)started engine is up in ~12 s instead of ~22 s on
        # 2 cores (python benchmarks/diagnostics/engine_restart.py --runs 3), which is what a supervised restart
        # waits for
        "VLLM_USE_AOT_COMPILE": "0",
    }


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def engine_dtype(dtype: EngineDtype) -> EngineDtype:
    """The dtype an engine is built with. ``auto`` on a CPU without bfloat16 matrix instructions (AMX tiles,
    AVX512-BF16) is float32: vLLM's own ``auto`` casts a float32 checkpoint to bfloat16 on every x86 CPU, and
    one without them (an AVX2-only EPYC) computes it through a fallback several times slower than float32.
    Elsewhere ``auto`` is vLLM's, and an explicit dtype is taken as it is."""
    if dtype == "auto" and on_cpu() and not cpu_has_bf16():
        logger.info("engine.dtype auto: float32, this CPU has no bfloat16 matrix instructions (AMX, AVX512-BF16)")
        return "float32"
    return dtype


def build_engine_args(
    cfg: EngineConfig,
    model: str,
    role: EngineRole,
    *,
    chunk_size: int | None = None,
    endpoint: str = "default",
    transport: str = "tcp",
    kv_deadline_s: float = 30.0,
    sync_load_bytes: int | None = None,
    scheduler_cls: str | None = None,
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute",
) -> EngineArgs:
    """EngineArgs for one engine. A prefill and a decode engine are the same engine, so that a worker can flip
    between the roles without reloading it (TetriInfer §3.5): its KV connector can both park and receive
    (``kv_both``), prefix caching is on (the decode role never lets a local hit stand in for KV that arrives) and
    its step budget fits a whole prompt; the prefill role caps each step at ``chunk_size`` in its scheduler.
    ``role`` only tells a worker's engine from a colocated one (no connector)."""
    from vllm import EngineArgs
    from vllm.config import KVTransferConfig

    kv_config = None
    connector_extra: dict[str, str | float | int] = {
        "endpoint": endpoint,
        "backend": transport,
        "deadline_s": kv_deadline_s,
    }
    if sync_load_bytes is not None:  # the connector's own default otherwise
        connector_extra["sync_load_bytes"] = sync_load_bytes
    if role is not EngineRole.COLOCATED:
        kv_config = KVTransferConfig(
            kv_connector=CONNECTOR_CLASS,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_both",
            kv_load_failure_policy=kv_load_failure_policy,
            kv_connector_extra_config=connector_extra,
        )
    extra: _RoleArgs = {}
    if role is not EngineRole.COLOCATED:  # tokens handed in as prompt may be output: penalties count them
        extra["logits_processors"] = [PRIOR_OUTPUTS_PROCESSOR]
    if scheduler_cls is not None:
        extra["scheduler_cls"] = scheduler_cls
    if on_cpu():
        extra["worker_cls"] = CPU_WORKER_CLASS
        extra["kv_cache_memory_bytes"] = int(cfg.kv_cache_gb * (1 << 30))
    else:
        extra["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    batched = max(cfg.max_model_len, chunk_size or 0)
    return EngineArgs(
        model=model,
        served_model_name=cfg.served_model_name,
        dtype=engine_dtype(cfg.dtype),
        max_model_len=cfg.max_model_len,
        block_size=cfg.block_size,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        enforce_eager=cfg.enforce_eager,
        seed=cfg.seed,
        async_scheduling=False,
        kv_transfer_config=kv_config,
        disable_log_stats=False,
        **extra,
    )
