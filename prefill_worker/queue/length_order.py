"""SJF and LJF (TetriInfer §3.3.1): order by prompt length, ascending or descending.

TetriInfer sorts each PrefillSchedBatch of requests by prompt token length and
appends the sorted batch to the scheduled queue; the batch boundary
(``admission.SchedBatchGate``, ``ReqView.batch_seq``) bounds the starvation
either order causes. Ties keep arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.prefill_worker.queue.base import Stateless
from tetriserve.prefill_worker.views import ReqView


class SJF(Stateless):
    name: ClassVar[str] = "sjf"

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]:
        return sorted(waiting, key=lambda r: (r.batch_seq, r.prompt_len, r.arrival_time, r.request_id))


class LJF(Stateless):
    name: ClassVar[str] = "ljf"

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]:
        return sorted(waiting, key=lambda r: (r.batch_seq, -r.prompt_len, r.arrival_time, r.request_id))
