"""FCFS (TetriInfer §3.3.1): scheduled batches in order, arrival order within; ties broken by request id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.prefill_worker.queue.base import Stateless
from tetriserve.prefill_worker.views import ReqView


class FCFS(Stateless):
    name: ClassVar[str] = "fcfs"

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]:
        return sorted(waiting, key=lambda r: (r.batch_seq, r.arrival_time, r.request_id))
