"""The decode admission seam: ``admit(req, state) -> bool`` (TetriInfer §3.4).

The adapter asks once per waiting request, in arrival order, and folds each
admitted request into the state (``DecodeState.with_admitted``) before asking
about the next; a refused request stays queued with its KV (if landed) held.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from decode_worker.views import DecodeReqView, DecodeState


class AdmissionPolicy(Protocol):
    name: ClassVar[str]

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool: ...
