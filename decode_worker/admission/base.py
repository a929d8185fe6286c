"""The decode admission seam: ``order(waiting, state)`` then ``admit(req, state) -> bool`` (TetriInfer §3.4).

The adapter asks ``order`` for the sequence in which waiting requests are put to
the policy (arrival order unless a policy says otherwise, e.g. SOLA's predicted
TPOT), then asks ``admit`` once per request in that order, folding each admitted
request into the state (``DecodeState.with_admitted``) before asking about the
next; the first refusal holds back everyone behind it for this step. A refused
request stays queued with its KV (if landed) held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from tetriserve.decode_worker.views import DecodeReqView, DecodeState


class AdmissionPolicy(Protocol):
    name: ClassVar[str]

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]: ...

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool: ...


class ArrivalOrder:
    """Put waiting requests to the policy first come, first served."""

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        return sorted(waiting, key=lambda r: r.arrival_time)
