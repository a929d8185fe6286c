"""Reserve-static admission (TetriInfer §3.4).

Every admitted request reserves its predicted KV: its context plus the tokens it
is predicted to generate (the predicted range's lower end, as in the paper). A
new request is admitted only if its reservation fits what the batch's
reservations leave of the KV cache:

    capacity = free + Σ_batch held_i          (blocks the batch holds now)
    admit ⇔  Σ_batch blocks(context_i + rem_i) + blocks(context_new + rem_new) − held_new ≤ capacity
"""

from __future__ import annotations

from typing import ClassVar

from tetriserve.decode_worker.admission.base import ArrivalOrder
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, LengthEnd, blocks_for


class ReserveStatic(ArrivalOrder):
    name: ClassVar[str] = "reserve-static"

    def __init__(self, end: LengthEnd = "lower") -> None:
        self.end: LengthEnd = end

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        bs = state.block_size
        capacity = state.capacity + req.held_blocks
        reserved = sum(blocks_for(r.context + r.predicted_remaining(self.end), bs) for r in state.running)
        return reserved + blocks_for(req.context + req.predicted_remaining(self.end), bs) <= capacity
