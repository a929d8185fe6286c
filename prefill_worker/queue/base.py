"""The prefill queue policy seam: ``order(waiting, now) -> list``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from prefill_worker.views import ReqView


class QueuePolicy(Protocol):
    name: ClassVar[str]

    def order(self, waiting: Sequence[ReqView], now: float) -> list[ReqView]: ...
