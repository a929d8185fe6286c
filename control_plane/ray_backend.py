"""``ServingBackend`` over a launched Ray cluster: what the front doors call.

One long-lived subscription to the GlobalScheduler carries the chunks of every
request this process submitted (``common.outbox``); ``generate`` registers a
queue for its request, submits it, and reads the queue. The subscription is
bound to the event loop it was opened in and reopened if that loop changes.

``status`` asks every worker actor for its policies in parallel, each with a
deadline, so a stuck worker shows an empty policy instead of hanging the call;
``set_policy`` checks the change (``policy_admin``) before any actor sees it and
calls the targeted workers' ``set_policy`` (prefill or decode, by the target's role).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from common.request import Request
from common.stream import StreamChunk
from control_plane.backend import ClusterStatus, WorkerPolicy, WorkerStatus
from control_plane.launcher import Cluster
from control_plane.policy_admin import Setter, apply_changes, parse_changes, resolve_targets

logger = logging.getLogger(__name__)

POLICIES_TIMEOUT_S = 2.0  # status: a worker that does not answer by then shows no policy
SET_POLICY_TIMEOUT_S = 30.0


class _Subscription:
    def __init__(self, scheduler: Any) -> None:
        self.id = f"frontdoor-{uuid.uuid4().hex[:12]}"
        self.loop = asyncio.get_running_loop()
        self.queues: dict[str, asyncio.Queue[StreamChunk]] = {}
        self._stream = scheduler.subscribe.remote(self.id)
        self.task = self.loop.create_task(self._route())

    async def _route(self) -> None:
        try:
            async for ref in self._stream:
                for chunk in await ref:
                    queue = self.queues.get(chunk.request_id)
                    if queue is not None:
                        queue.put_nowait(chunk)
        except Exception as exc:
            logger.exception("subscription %s to the GlobalScheduler failed", self.id)
            for rid, queue in self.queues.items():
                queue.put_nowait(StreamChunk(rid, (), "error", f"control plane unreachable: {exc}"))

    def close(self) -> None:
        import ray

        self.task.cancel()
        try:
            ray.cancel(self._stream)
        except Exception:
            logger.debug("cancel of subscription %s failed", self.id, exc_info=True)


class RayBackend:
    def __init__(self, cluster: Cluster, model_name: str) -> None:
        self.cluster = cluster
        self._model_name = model_name
        self._sub: _Subscription | None = None

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_path(self) -> str:
        return self.cluster.model_path

    @property
    def max_model_len(self) -> int:
        return self.cluster.config.engine.max_model_len

    def _subscription(self) -> _Subscription:
        loop = asyncio.get_running_loop()
        if self._sub is None or self._sub.loop is not loop or self._sub.task.done():
            if self._sub is not None and self._sub.loop is loop:
                self._sub.close()
            self._sub = _Subscription(self.cluster.scheduler)
        return self._sub

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        sub = self._subscription()
        rid = request.request_id
        queue: asyncio.Queue[StreamChunk] = asyncio.Queue()
        sub.queues[rid] = queue
        finished = False
        try:
            error = await self.cluster.scheduler.submit.remote(request, sub.id)
            if error is not None:
                finished = True
                yield StreamChunk(rid, (), "error", error)
                return
            while not finished:
                chunk = await queue.get()
                finished = chunk.finish_reason is not None
                yield chunk
        finally:
            sub.queues.pop(rid, None)
            if not finished:  # the client went away or the caller gave up: abort everywhere
                self.cluster.scheduler.abort.remote(rid)

    def close(self) -> None:
        """Drop the subscription (call from the loop that used the backend)."""
        if self._sub is not None:
            self._sub.close()
            self._sub = None

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
        members, sched, policies = await asyncio.gather(
            self.cluster.monitor.snapshot.remote(), self.cluster.scheduler.status.remote(), self._policies()
        )
        workers = tuple(
            WorkerStatus(m["worker_id"], m["role"], m["state"], m["load"], policies.get(m["worker_id"], {}))
            for m in members
        )
        return ClusterStatus(self._model_name, workers, int(sched["in_flight"]), self.cluster.dashboard_url)

    async def _policies(self) -> dict[str, dict[str, str]]:
        """Every worker's ``policies()``, asked in parallel; ``{}`` for one that fails or is late."""
        handles = {**self.cluster.prefill, **self.cluster.decode}

        async def one(worker_id: str, handle: Any) -> dict[str, str]:
            try:
                return dict(await asyncio.wait_for(handle.policies.remote(), POLICIES_TIMEOUT_S))
            except Exception as exc:
                logger.warning("status: no policies from %s (%s: %s)", worker_id, type(exc).__name__, exc)
                return {}

        answers = await asyncio.gather(*(one(wid, h) for wid, h in handles.items()))
        return dict(zip(handles, answers, strict=True))

    async def set_policy(self, worker_id: str | None, changes: dict[str, str]) -> list[WorkerPolicy]:
        role, targets = resolve_targets(worker_id, self.cluster.prefill, self.cluster.decode)
        parsed = parse_changes(role, changes)
        return await apply_changes({wid: _actor_setter(h) for wid, h in targets.items()}, parsed, role)


def _actor_setter(handle: Any) -> Setter:
    """``handle.set_policy.remote`` as a coroutine that raises the worker's own ValueError, not Ray's wrapper."""

    async def call(changes: dict[str, Any]) -> dict[str, str]:
        try:
            return dict(await asyncio.wait_for(handle.set_policy.remote(changes), SET_POLICY_TIMEOUT_S))
        except ValueError as exc:  # Ray raises a RayTaskError that is also a ValueError; .cause is the worker's
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, ValueError) else exc) from None

    return call
