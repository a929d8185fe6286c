"""The prefill queue policy seam: ``order(waiting, now) -> list``, plus hooks for policies with state.

``remaining_times`` gives each request's time left to its SLO (the chunking policies'
urgency input); ``on_scheduled`` tells the policy which requests an iteration took;
``forget`` drops a finished request's state. ``Stateless`` supplies the no-op hooks
for policies that only order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol

from tetriserve.prefill_worker.views import ReqView


class QueuePolicy(Protocol):
    name: ClassVar[str]

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]: ...

    def remaining_times(self, waiting: Iterable[ReqView], now: float) -> dict[str, float]: ...

    def on_scheduled(self, scheduled: Iterable[ReqView], now: float) -> None: ...

    def forget(self, request_id: str) -> None: ...


class Stateless:
    """The hooks of a policy that keeps no per-request state and knows no SLOs."""

    def remaining_times(self, waiting: Iterable[ReqView], now: float) -> dict[str, float]:
        return {}

    def on_scheduled(self, scheduled: Iterable[ReqView], now: float) -> None:
        return None

    def forget(self, request_id: str) -> None:
        return None
