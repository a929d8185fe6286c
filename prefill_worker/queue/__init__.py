"""Prefill queue policies (TetriInfer §3.3.1): order the raw queue, move PrefillSchedBatch at a time."""

from __future__ import annotations

from prefill_worker.queue.base import QueuePolicy
from prefill_worker.queue.fcfs import FCFS

QUEUE_POLICIES: dict[str, type[QueuePolicy]] = {FCFS.name: FCFS}


def make_queue_policy(name: str) -> QueuePolicy:
    try:
        return QUEUE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"prefill.queue_policy: unknown policy {name!r}; known: {sorted(QUEUE_POLICIES)}") from None


__all__ = ["QUEUE_POLICIES", "QueuePolicy", "make_queue_policy"]
