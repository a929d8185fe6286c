"""Reserve-static admission (TetriInfer §3.4).

Admit a request only if its predicted KV — context plus the tokens it is
predicted to generate, by the predicted range's lower end as in the paper —
fits the KV that is free now:

    ⌈(context + remaining_pred) / b⌉ − held ≤ free
"""

from __future__ import annotations

from typing import ClassVar

from decode_worker.views import DecodeReqView, DecodeState, LengthEnd, blocks_for


class ReserveStatic:
    name: ClassVar[str] = "reserve-static"

    def __init__(self, end: LengthEnd = "lower") -> None:
        self.end: LengthEnd = end

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        need = blocks_for(req.context + req.predicted_remaining(self.end), state.block_size) - req.held_blocks
        return need <= state.free_blocks
