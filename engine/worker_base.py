"""What prefill and decode workers share: an engine, a transport endpoint, load reports, stats.

start(monitor) ─▶ every report_interval_ms: monitor.report(load())   (TetriInfer §3.2)
stats()        ─▶ the engine's own counters, the KV connector's, the transport's, the policies in force
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from common.config import ClusterConfig
from common.load import DecodeLoad, PrefillLoad

logger = logging.getLogger(__name__)


class EngineWorker:
    """Base of the worker actors; subclasses build ``self.engine`` and implement ``load`` and ``policies``."""

    def __init__(self, worker_id: str, config: ClusterConfig) -> None:
        from transport import endpoints

        self.worker_id = worker_id
        self.config = config
        self.endpoint = endpoints.get_or_create(worker_id, config.transport, f"{config.host}:0")
        self.engine: Any = None
        self._monitor: Any = None
        self._report_task: asyncio.Task[None] | None = None

    async def start(self, monitor: Any) -> str:
        """Begin load reports to the ClusterMonitor; returns the KV endpoint address to advertise."""
        self._monitor = monitor
        self._report_task = asyncio.create_task(self._report_loop())
        return self.endpoint.address

    def load(self) -> PrefillLoad | DecodeLoad:
        raise NotImplementedError

    def policies(self) -> dict[str, str]:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        from transport import kv_connector

        return {
            "engine": self.engine.stats(),
            "kv": kv_connector.counters(),
            "transport": self.endpoint.stats(),
            "policy": self.policies(),
        }

    async def parked_kv(self, key: str, give_up: Callable[[], bool] = lambda: False) -> list[bytearray] | None:
        """The KV the engine parked in this endpoint under ``key`` (in the step that computed it), or None
        once ``give_up()`` or the transfer deadline has passed."""
        deadline = time.monotonic() + self.config.kv_transfer_timeout_s
        while (buffers := self.endpoint.recv(key)) is None:
            if give_up() or time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.001)
        return buffers

    async def _report_loop(self) -> None:
        interval = self.config.report_interval_ms / 1000
        while True:
            try:
                self._monitor.report.remote(self.load())
            except Exception:
                logger.exception("%s: load report failed", self.worker_id)
            await asyncio.sleep(interval)
