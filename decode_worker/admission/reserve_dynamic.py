"""Reserve-dynamic admission (TetriInfer §3.4).

Admit a request only if KV is still free when the shortest remaining job in
the batch finishes, from predicted remaining tokens (the range's lower end):

    k     = min over the batch of predicted remaining tokens   (0: one finishes this very step)
    grow  = Σ_batch  blocks(context_i + min(k, rem_i)) − blocks(context_i)
    new   = blocks(context_new + min(k, rem_new)) − held_new
    admit ⇔ grow + new ≤ free

With an empty batch nothing finishes first: the request is admitted if its
context fits now. Growth is counted before the finishing job frees its blocks,
so the check errs on the side of not preempting.
"""

from __future__ import annotations

from typing import ClassVar

from decode_worker.views import DecodeReqView, DecodeState, LengthEnd, blocks_for


class ReserveDynamic:
    name: ClassVar[str] = "reserve-dynamic"

    def __init__(self, end: LengthEnd = "lower") -> None:
        self.end: LengthEnd = end

    def horizon(self, state: DecodeState) -> int:
        """k: steps until the shortest job in the batch finishes (by prediction)."""
        return min((r.predicted_remaining(self.end) for r in state.running), default=0)

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        bs = state.block_size
        k = self.horizon(state)
        grow = sum(r.blocks_at(k, bs, self.end) - blocks_for(r.context, bs) for r in state.running)
        new = req.blocks_at(k, bs, self.end) - req.held_blocks
        return grow + new <= state.free_blocks
