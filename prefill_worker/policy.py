"""A prefill worker's scheduling policy: queue order + chunking, built by name from the config.

``PrefillPolicySpec`` is what the cluster config, the CLI and the admin RPC
carry; ``build_prefill_policy`` turns it into the pure policy objects the
gate (raw → scheduled queue) and the vLLM scheduler subclass consult.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from tetriserve.common.cost_estimator import CostEstimator, load_estimator
from tetriserve.common.cost_profile import default_profile_path
from tetriserve.common.prefill_config import PrefillConfig
from tetriserve.prefill_worker.chunking import ChunkingPolicy, make_chunking_policy
from tetriserve.prefill_worker.chunking.dynamic import Selection
from tetriserve.prefill_worker.queue import QueuePolicy, make_queue_policy

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefillPolicySpec:
    queue: str = "fcfs"
    chunking: str = "fixed"
    chunk_size: int = 512
    selection: Selection = "in-order"
    sched_batch: int = 16
    offload_max_tokens: int = 512  # prompts this short go to a decode worker with room (``Offloader.offer_short``)
    sola_tile_tokens: int = 0  # SOLA §4.4.3's tile (0: the cost profile's, else 128)
    sola_window_iters: int = 8  # SOLA §4.4.2's sliding window, iterations

    def updated(self, changes: Mapping[str, object]) -> PrefillPolicySpec:
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"prefill policy: unknown field(s) {sorted(unknown)}")
        build: Callable[..., PrefillPolicySpec] = PrefillPolicySpec  # the changes' values are checked upstream
        return build(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})

    def describe(self) -> dict[str, str]:
        out = {
            "queue": self.queue,
            "chunking": self.chunking,
            "sched_batch": str(self.sched_batch),
            "offload_max_tokens": str(self.offload_max_tokens),
        }
        if self.chunking == "fixed":
            out["chunk_size"] = str(self.chunk_size)
        if self.chunking == "dynamic":
            out["selection"] = self.selection
        if self.chunking == "sola":
            out["sola_tile_tokens"] = str(self.sola_tile_tokens or "profile")
            out["sola_window_iters"] = str(self.sola_window_iters)
        return out


@dataclass(frozen=True)
class AccelGenParams:
    """AccelGen's parameters (``prefill.accelgen_*``, set at start only): Alg. 2's γ in iterations of T_max,
    ERA's long-prompt threshold (None: S_pf), and §4.3's P_max (iterations of T_max) and P."""

    group_window_iters: float = 4.0
    long_prompt_tokens: int | None = 4096
    preempt_max_iters: float = 1.0
    preempt_probability: float = 0.0

    @classmethod
    def from_config(cls, cfg: PrefillConfig) -> AccelGenParams:
        return cls(
            cfg.accelgen_group_window_iters,
            cfg.accelgen_long_prompt_tokens,
            cfg.accelgen_preempt_max_iters,
            cfg.accelgen_preempt_probability,
        )


@dataclass(frozen=True)
class PrefillPolicy:
    spec: PrefillPolicySpec
    queue: QueuePolicy
    chunking: ChunkingPolicy
    cost: CostEstimator | None = None
    accelgen: AccelGenParams = AccelGenParams()


def chunk_tokens(spec: PrefillPolicySpec, cost: CostEstimator | None) -> int:
    """The prompt tokens of one prefill chunk: the cost profile's pivot S_pf with dynamic chunking (its budget
    without an SLO, AccelGen §4.2 eq. 6), else ``chunk_size``."""
    return cost.pivot_tokens if cost is not None and spec.chunking == "dynamic" else spec.chunk_size


def build_prefill_policy(
    spec: PrefillPolicySpec, cost: CostEstimator | None, accelgen: AccelGenParams = AccelGenParams()
) -> PrefillPolicy:
    """Raises ValueError naming the field when a name is unknown or a needed cost model is missing."""
    if spec.sched_batch < 1:
        raise ValueError(f"prefill.sched_batch must be >= 1, got {spec.sched_batch}")
    if spec.sola_tile_tokens < 0 or spec.sola_window_iters < 1:
        raise ValueError(
            f"prefill.sola_tile_tokens must be >= 0 and sola_window_iters >= 1, got {spec.sola_tile_tokens}, "
            f"{spec.sola_window_iters}"
        )
    if spec.offload_max_tokens < 0:
        raise ValueError(f"prefill.offload_max_tokens must be >= 0, got {spec.offload_max_tokens}")
    queue = make_queue_policy(
        spec.queue, cost, chunk_tokens(spec, cost), accelgen.preempt_max_iters, accelgen.preempt_probability
    )
    chunking = make_chunking_policy(
        spec.chunking,
        spec.chunk_size,
        cost,
        spec.selection,
        accelgen.long_prompt_tokens,
        accelgen.group_window_iters,
        spec.sola_tile_tokens,
        spec.sola_window_iters,
    )
    return PrefillPolicy(spec, queue, chunking, cost, accelgen)


def spec_from_config(cfg: PrefillConfig) -> PrefillPolicySpec:
    return PrefillPolicySpec(
        cfg.queue_policy,
        cfg.chunking,
        cfg.chunk_size,
        cfg.chunk_selection,
        cfg.sched_batch,
        cfg.offload_max_tokens,
        cfg.sola_tile_tokens or 0,
        cfg.sola_window_iters,
    )


def load_cost(cfg: PrefillConfig, model: str, hardware: str) -> CostEstimator | None:
    """The configured cost profile, else this model's default one on this hardware when it exists, else None."""
    cost = load_estimator(cfg.cost_profile, model, hardware, cfg.cost_alpha)
    if cost is None:
        path = default_profile_path(model, hardware)
        logger.info("no cost profile at %s: cost-aware policies stay off until `tetriserve profile` writes one", path)
    return cost
