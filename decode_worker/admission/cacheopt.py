"""CacheOpt admission: padded reservation, reuse, proactive allocation, global reserve (CacheOpt §3.3).

Each request is granted KV for its *padded* predicted demand Mᵢ = s_p + s_o,
where s_o is the served estimate, already Hoeffding-padded by the length
predictor at confidence c = α/(1+βλ) (CacheOpt §3.2, ``length_predictor/padding.py``).
How the paper's mechanisms map onto vLLM's paged KV, which allocates blocks on
demand and has no per-request reservation to carve up:

* **reuse of allocated-but-unused KV** (§3.3.1, the "embedding method"): admission is
  time-aware. A newcomer may use KV that a running request has been granted but
  will only grow into later, provided the newcomer is predicted to finish first,
  with ``buffer_tokens`` (the paper's b) of slack per request. This is the peak
  check of ``peak.py`` over every predicted finish; with two requests it reduces
  to the paper's condition aⱼ − (uⱼ + s_iᵒ) − (s_iᵖ + s_iᵒ) ≥ b.
* **proactive allocation** (§3.3.3): a running request that has outlived its padded
  estimate is treated as still needing ``proactive_tokens`` more (m iterations'
  worth), granted ahead of need, before any newcomer is admitted, instead of
  being ignored until its next block allocation fails.
* **global reserve** (§3.3.3): ``reserve_blocks`` are kept out of what admission
  grants. vLLM allocates from the one shared pool, so a request that overruns its
  grant draws on those blocks instead of forcing a preemption.

An empty batch admits whatever fits now, so a request larger than its grant
still runs (alone). The SLO-critical request selection of §3.3.2 (critical requests, their basic demand,
the excess amortised by weights) is not built: decode admission asks waiting requests in arrival order.
"""

from __future__ import annotations

from typing import ClassVar

from tetriserve.decode_worker.admission.base import ArrivalOrder
from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


class CacheOptAdmission(ArrivalOrder):
    name: ClassVar[str] = "cacheopt"

    def __init__(self, reserve_blocks: int = 4, proactive_tokens: int = 8, buffer_tokens: int = 8) -> None:
        if min(reserve_blocks, proactive_tokens, buffer_tokens) < 0:
            raise ValueError("cacheopt admission: reserve_blocks, proactive_tokens and buffer_tokens must be >= 0")
        self.reserve_blocks = reserve_blocks
        self.proactive_tokens = proactive_tokens
        self.buffer_tokens = buffer_tokens

    def remaining(self, r: DecodeReqView) -> int:
        """Its padded remaining demand; once outlived, the next ``proactive_tokens`` (capped by max_tokens)."""
        rem = r.predicted_remaining("estimate")
        if rem == 0:
            rem = min(self.proactive_tokens, max(0, r.max_tokens - r.generated))
        return rem

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        return admits(req, state, self.remaining, reserve=self.reserve_blocks, pad=self.buffer_tokens)
