"""The decode role's view of its engine: the engine's scheduler as the role's (``TetriDecodeScheduler``), and the
snapshot that scheduler publishes. vLLM is imported on first use, so the worker's modules load without it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tetriserve.decode_worker.views import DecodeSnapshot

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler


def decode_role(scheduler: Scheduler) -> TetriDecodeScheduler:
    """The engine's scheduler as the decode role's, in a call into the engine (``EngineLoop.call``)."""
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler

    return TetriDecodeScheduler.of(scheduler)


def snapshot_of(extra: object) -> DecodeSnapshot | None:
    """The decode role's published snapshot (None before its scheduler has published one)."""
    return extra if isinstance(extra, DecodeSnapshot) else None
