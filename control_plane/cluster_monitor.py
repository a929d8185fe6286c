"""ClusterMonitor (TetriInfer §3.2): collects load reports and broadcasts decode loads.

Every worker reports its load every ``report_interval_ms``. On the same period
the monitor sends the latest decode loads (with decode endpoints and actor
handles) to every prefill worker, whose dispatcher decides locally, and the
latest prefill loads to the GlobalScheduler. A worker whose last report is
older than ``stale_after`` periods is shown as ``stale`` and left out of the
broadcast.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from common.load import DecodeLoad, PrefillLoad, Role

logger = logging.getLogger(__name__)


@dataclass
class _Member:
    worker_id: str
    role: Role
    handle: Any
    address: str
    load: PrefillLoad | DecodeLoad | None = None
    state: str = "starting"


class ClusterMonitor:
    def __init__(self, report_interval_ms: int = 100, stale_after: int = 30) -> None:
        self.interval = report_interval_ms / 1000
        self.stale_s = self.interval * stale_after
        self.members: dict[str, _Member] = {}
        self.scheduler: Any = None
        self.broadcasts = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        if self._task is None:
            self._task = asyncio.create_task(self._broadcast_loop())

    def register(self, worker_id: str, role: str, handle: Any, address: str) -> None:
        self.members[worker_id] = _Member(worker_id, Role(role), handle, address)

    def report(self, load: PrefillLoad | DecodeLoad) -> None:
        member = self.members.get(load.worker_id)
        if member is not None:
            member.load = load
            member.state = "serving"

    def _fresh(self, role: Role) -> list[_Member]:
        now = time.time()
        out = []
        for m in self.members.values():
            if m.role is role and m.load is not None:
                if now - m.load.at > self.stale_s:
                    m.state = "stale"
                    continue
                out.append(m)
        return out

    async def _broadcast_loop(self) -> None:
        while True:
            try:
                self.broadcast_once()
            except Exception:
                logger.exception("cluster monitor: broadcast failed")
            await asyncio.sleep(self.interval)

    def broadcast_once(self) -> None:
        decode = self._fresh(Role.DECODE)
        loads = [m.load for m in decode]
        addresses = {m.worker_id: m.address for m in decode}
        handles = {m.worker_id: m.handle for m in decode}
        for m in self.members.values():
            if m.role is Role.PREFILL:
                m.handle.update_decode_view.remote(loads, addresses, handles)
        if self.scheduler is not None:
            self.scheduler.update_prefill_loads.remote([m.load for m in self._fresh(Role.PREFILL)])
        self.broadcasts += 1

    def snapshot(self) -> list[dict[str, Any]]:
        self._fresh(Role.PREFILL)
        self._fresh(Role.DECODE)
        return [
            {
                "worker_id": m.worker_id,
                "role": m.role.value,
                "state": m.state,
                "address": m.address,
                "load": _load_dict(m.load),
            }
            for m in sorted(self.members.values(), key=lambda m: (m.role.value, m.worker_id))
        ]


def _load_dict(load: PrefillLoad | DecodeLoad | None) -> dict[str, float]:
    if load is None:
        return {}
    out = {k: float(v) for k, v in vars(load).items() if isinstance(v, (int, float)) and k != "at"}
    out["age_ms"] = round((time.time() - load.at) * 1000, 1)
    return out
