"""``ServingBackend`` over a launched Ray cluster: what the front doors call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from common.request import Request
from common.stream import StreamChunk
from control_plane.backend import ClusterStatus, WorkerStatus
from control_plane.launcher import Cluster

logger = logging.getLogger(__name__)


class RayBackend:
    def __init__(self, cluster: Cluster, model_name: str) -> None:
        self.cluster = cluster
        self._model_name = model_name

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_path(self) -> str:
        return self.cluster.model_path

    @property
    def max_model_len(self) -> int:
        return self.cluster.config.engine.max_model_len

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        import ray

        gen = self.cluster.scheduler.generate.remote(request)
        finished = False
        try:
            async for ref in gen:
                chunk: StreamChunk = await ref
                finished = chunk.finish_reason is not None
                yield chunk
                if finished:
                    return
        finally:
            if not finished:  # the client went away or the caller gave up: abort everywhere
                self.cluster.scheduler.abort.remote(request.request_id)
                try:
                    ray.cancel(gen)
                except Exception:
                    logger.debug("cancel of %s stream failed", request.request_id, exc_info=True)

    async def abort(self, request_id: str) -> bool:
        return bool(await self.cluster.scheduler.abort.remote(request_id))

    async def healthy(self) -> bool:
        try:
            await asyncio.wait_for(self.cluster.scheduler.status.remote(), timeout=5)
            members = await asyncio.wait_for(self.cluster.monitor.snapshot.remote(), timeout=5)
        except Exception:
            return False
        return all(m["state"] == "serving" for m in members)

    async def status(self) -> ClusterStatus:
        members = await self.cluster.monitor.snapshot.remote()
        sched = await self.cluster.scheduler.status.remote()
        workers = tuple(WorkerStatus(m["worker_id"], m["role"], m["state"], m["load"]) for m in members)
        return ClusterStatus(self._model_name, workers, int(sched["in_flight"]), self.cluster.dashboard_url)
