"""The base of the roles' vLLM scheduler subclasses (``prefill_worker/vllm_scheduler.py``,
``decode_worker/vllm_scheduler.py``): vLLM's ``Scheduler`` with a role's state on top.

vLLM builds the scheduler from ``scheduler_cls`` with its own constructor (vLLM 0.32's signature, spelled out so
the arguments stay typed); a flip instead turns the engine's live scheduler into the other role's class
(``assume``). Either way ``_take_role`` sets the role's state up afresh, leaving vLLM's own state as it is.
The engine loop hands calls vLLM's ``Scheduler``; ``of`` gives it the role's type.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Self, cast

from vllm.multimodal import MULTIMODAL_REGISTRY, MultiModalRegistry
from vllm.v1.core.sched.scheduler import Scheduler

from tetriserve.common.engine_tags import TAGS_KEY, tags_of
from tetriserve.common.length import LengthEstimate

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager


class RoleScheduler(Scheduler):
    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager: StructuredOutputManager,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: MultiModalRegistry = MULTIMODAL_REGISTRY,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        super().__init__(
            vllm_config,
            kv_cache_config,
            structured_output_manager,
            block_size,
            hash_block_size,
            mm_registry,
            include_finished_set,
            log_stats,
        )
        self._take_role()

    @classmethod
    def of(cls, scheduler: Scheduler) -> Self:
        """The engine's scheduler as this role's, once the role has taken it (``EngineLoop.take_role``): what the
        role's calls into the engine (``EngineLoop.call``) are given. Not checked at run time, so that a role's
        calls can be driven against a fake of its scheduler."""
        return cast(Self, scheduler)

    def _take_role(self) -> None:
        """Set up the role's own state (at construction, and on every flip to the role)."""
        raise NotImplementedError


def retag(scheduler: Scheduler, request_id: str, estimate: LengthEstimate) -> str | None:
    """Give the worker's ``request_id`` a new length estimate in its engine tags; the engine's id of the request
    retagged, None where the engine does not hold it."""
    for req in scheduler.requests.values():
        params = req.sampling_params
        extra_args = params.extra_args if params is not None else None
        tags = tags_of(extra_args)
        if tags.request_id == request_id and extra_args is not None:  # tagged: extra_args holds the tags
            extra_args[TAGS_KEY] = replace(tags, estimate=estimate)
            return req.request_id
    return None
