"""Prefill queue policies: order the queue; the gate moves PrefillSchedBatch at a time (TetriInfer §3.3.1).

fcfs      arrival order                                      TetriInfer §3.3.1
sjf/ljf   shortest / longest prompt first                    TetriInfer §3.3.1
accelgen  ascending remaining time to the SLO, urgent first  AccelGen §4.3
sola      descending predicted TTFT                          SOLA §4.4.2
"""

from __future__ import annotations

from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.prefill_worker.queue.accelgen import AccelGenRemainingTime
from tetriserve.prefill_worker.queue.base import QueuePolicy
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.queue.length_order import LJF, SJF
from tetriserve.prefill_worker.queue.sola import SolaTTFT

QUEUE_POLICY_NAMES = ("fcfs", "sjf", "ljf", "accelgen", "sola")


def make_queue_policy(
    name: str,
    cost: CostEstimator | None = None,
    chunk_tokens: int | None = None,
    preempt_max_iters: float = 0.0,
    preempt_probability: float = 0.0,
) -> QueuePolicy:
    """Build a queue policy by name; ``cost`` is required by the cost-aware ones (accelgen, sola);
    ``preempt_max_iters`` and ``preempt_probability`` are accelgen's P_max (iterations of T_max) and P."""
    if name == FCFS.name:
        return FCFS()
    if name == SJF.name:
        return SJF()
    if name == LJF.name:
        return LJF()
    if name in (AccelGenRemainingTime.name, SolaTTFT.name):
        if cost is None:
            raise ValueError(f"prefill.queue_policy {name!r} needs a cost model (prefill.cost_profile)")
        if name == SolaTTFT.name:
            return SolaTTFT(cost)
        return AccelGenRemainingTime(cost, chunk_tokens, preempt_max_iters, preempt_probability)
    raise ValueError(f"prefill.queue_policy: unknown policy {name!r}; known: {list(QUEUE_POLICY_NAMES)}")


__all__ = ["QUEUE_POLICY_NAMES", "QueuePolicy", "make_queue_policy"]
