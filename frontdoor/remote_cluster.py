"""A front door's side of a detached control plane (``control_plane/control_plane.py``): the cluster as
``RayBackend`` sees it.

``RemoteCluster`` has the attributes ``RayBackend`` reads of a launched
``Cluster`` (config, model path, the workers', GlobalScheduler's and monitor's
handles) and the calls it makes of one (``control()``: status extras, flip,
scale, SLO observations), answered by the ControlPlane actor. The handles are
refreshed from ``ControlPlane.view`` every ``VIEW_S`` on a daemon thread, so a
worker the supervisor re-created (or added) reaches this front door's streams
within that time. The front door leaving (``close``) leaves the cluster as it is.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Awaitable
from typing import TypeVar

from tetriserve.control_plane.batched_calls import OneCallOut
from tetriserve.control_plane.control_plane import ClusterInfo, ClusterView, SloSample, SupervisionState
from tetriserve.control_plane.handles import ControlPlaneHandle, MonitorHandle, SchedulerHandle, WorkerHandle

logger = logging.getLogger(__name__)

VIEW_S = 0.5  # how often the handles are refreshed
CALL_TIMEOUT_S = 30.0

T = TypeVar("T")


class RemoteCluster:
    # the handles as the latest view listed them (``_apply``)
    prefill: dict[str, WorkerHandle]
    decode: dict[str, WorkerHandle]
    scheduler: SchedulerHandle
    monitor: MonitorHandle

    def __init__(self, handle: ControlPlaneHandle, info: ClusterInfo, view: ClusterView, refresh: bool = True) -> None:
        self.id = f"frontdoor-{uuid.uuid4().hex[:12]}"  # its attendance at the control plane (``view`` calls)
        self.handle = handle
        self._slo: OneCallOut[SloSample, None] = OneCallOut(lambda: self.handle.observe_slo_many, CALL_TIMEOUT_S)
        self.config = info.config
        self.model_path = info.model_path
        self.served_name = info.served_name
        self.dashboard_url = info.dashboard_url
        self._apply(view)
        self._stop = threading.Event()
        self.gone = threading.Event()  # the control plane died for good (``tetriserve stop``, ray.kill)
        if refresh:  # off: the caller applies views itself (tests)
            threading.Thread(target=self._refresh, name="control-plane-view", daemon=True).start()

    @classmethod
    def join(cls, handle: ControlPlaneHandle, timeout_s: float) -> RemoteCluster:
        """Wait (up to ``timeout_s``) until the control plane's cluster serves, then take its view."""
        import ray

        try:
            ready = ray.get(handle.ready.remote(timeout_s), timeout=timeout_s + CALL_TIMEOUT_S)
        except Exception as exc:  # the control plane's own reason the cluster did not start, not Ray's wrapper
            raise _cause(exc) from None
        if not ready:
            raise TimeoutError(f"the cluster did not start within {timeout_s:.0f} s")
        info, view = ray.get([handle.info.remote(), handle.view.remote()], timeout=CALL_TIMEOUT_S)
        if view is None:
            raise RuntimeError("the control plane answered ready without a cluster")
        remote = cls(handle, info, view)
        handle.view.remote(remote.id)  # attached from now on, not from the first refresh
        return remote

    def _apply(self, view: ClusterView) -> None:
        # each attribute is replaced whole: readers on other threads see the old dict or the new one. A handle
        # of the same actor is kept as the very object it was, whichever role it was listed under (a flip moves
        # a worker from one dict to the other): streams reopen only when a worker's handle changes
        known = {**getattr(self, "prefill", {}), **getattr(self, "decode", {})}
        self.prefill = {w: _same(known.get(w), h) for w, h in view.prefill.items()}
        self.decode = {w: _same(known.get(w), h) for w, h in view.decode.items()}
        self.scheduler = _same(getattr(self, "scheduler", None), view.scheduler)
        self.monitor = _same(getattr(self, "monitor", None), view.monitor)

    def _refresh(self) -> None:
        import ray

        while not self._stop.wait(VIEW_S):
            try:
                view = ray.get(self.handle.view.remote(self.id), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.ActorDiedError:  # for good (Ray restarts it otherwise): the service was stopped
                logger.warning("control plane: gone for good; the service is stopped")
                self.gone.set()
                return
            except Exception as exc:  # restarting: keep the handles we have until it answers again
                logger.warning("control plane: no view (%s); keeping the last one", type(exc).__name__)
                continue
            if view is not None:
                self._apply(view)

    def close(self) -> None:
        """This front door leaves; the cluster stays."""
        self._stop.set()
        try:
            self.handle.leave.remote(self.id)
        except Exception:  # the control plane is gone: nothing to leave
            logger.debug("control plane: leave not sent", exc_info=True)

    def others(self) -> list[str]:
        """The other front doors attached to the control plane now ([] if it does not answer)."""
        import ray

        try:
            others = ray.get(self.handle.frontdoors.remote(self.id), timeout=CALL_TIMEOUT_S)
            return list(others)
        except Exception:
            return []

    # -- the calls RayBackend makes of the control plane ---------------------------------------------------------
    def control(self) -> RemoteCluster:
        return self

    async def supervision_state(self) -> SupervisionState:
        state: SupervisionState = await _call(self.handle.supervision_state.remote())
        return state

    async def flip(self, worker_id: str, role: str) -> str:
        return str(await _call(self.handle.flip.remote(worker_id, role)))

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return list(await _call(self.handle.scale.remote(prefill, decode)))

    def observe_slo(
        self, ttft_ms: float, tpot_ms: float | None, ttft_slo_ms: float | None, tbt_slo_ms: float | None
    ) -> None:
        # many to a call (``control_plane/batched_calls.py``)
        self._slo.tell((ttft_ms, tpot_ms, ttft_slo_ms, tbt_slo_ms))


async def _call(ref: Awaitable[T]) -> T:
    """Await an actor call; raise the control plane's own exception (an unknown worker, a refused flip), not
    Ray's wrapper around it."""
    import asyncio

    try:
        return await asyncio.wait_for(ref, CALL_TIMEOUT_S)
    except Exception as exc:
        raise _cause(exc) from None


def _same(old: T | None, new: T) -> T:
    """``old`` if it is a handle of the same actor as ``new`` (Ray handles compare by actor id), else ``new``."""
    return old if old is not None and old == new else new


def _cause(exc: Exception) -> Exception:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc
