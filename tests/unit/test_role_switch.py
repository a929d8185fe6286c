"""A flip's swap on the engine (TetriInfer §3.5): the engine's one scheduler object takes either role's class,
keeping vLLM's own state, and the role's state starts afresh (no engine: a bare vLLM ``Scheduler`` object)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")


def _bare_scheduler(budget: int = 2048) -> Any:
    """A vLLM ``Scheduler`` as built for a worker's engine, minus everything a role switch does not touch."""
    from vllm.v1.core.sched.scheduler import Scheduler

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.scheduler_config = SimpleNamespace(max_num_scheduled_tokens=None, max_num_batched_tokens=budget)
    scheduler.max_num_scheduled_tokens = budget
    scheduler.running = ["vLLM's own state"]
    return scheduler


def test_the_scheduler_flips_between_roles_and_keeps_vllm_s_state() -> None:
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler
    from tetriserve.prefill_worker.vllm_scheduler import TetriPrefillScheduler

    scheduler = _bare_scheduler()
    prefill = TetriPrefillScheduler.assume(scheduler, ceiling=512)
    assert prefill is scheduler and type(scheduler) is TetriPrefillScheduler
    assert (scheduler.ceiling, scheduler.max_num_scheduled_tokens) == (512, 512)  # the chunk cap
    assert scheduler.prefill_policy.spec.chunk_size == 512
    scheduler.log.gamma = 3.0  # role state that must not survive a flip

    decode = TetriDecodeScheduler.assume(scheduler)
    assert decode is scheduler and type(scheduler) is TetriDecodeScheduler
    assert scheduler.max_num_scheduled_tokens == 2048  # the engine's whole budget again
    assert scheduler.admission.name == "greedy" and scheduler.slice_iters == 0 and scheduler.preemptions == 0
    assert scheduler.running == ["vLLM's own state"]

    TetriPrefillScheduler.assume(scheduler, ceiling=256)
    assert type(scheduler) is TetriPrefillScheduler and scheduler.ceiling == 256
    assert scheduler.log.gamma != 3.0
