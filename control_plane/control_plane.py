"""The control plane as one detached Ray actor that outlives every front door (``docs/design/ownership.md``).

    tetriserve serve ──▶ ControlPlane  detached, named "control-plane" in the config's namespace
                           └─ launch(): ClusterMonitor, GlobalScheduler, the workers (its own actors)
                              and the Supervision thread that re-creates the dead, flips and scales
    every front door (serve's own, and each ``tetriserve frontdoor --address ...``):
        ControlPlane.info()  once: config, model, served name, dashboard
        ControlPlane.view()  every VIEW_S: the current handles (a re-created worker's, an added one's)
        ─▶ RemoteCluster (``frontdoor/remote_cluster.py``) ─▶ RayBackend: places with the GlobalScheduler and streams
           straight from the workers; flip / scale / status extras go to the ControlPlane

Front doors hold nothing but their own streams: one that exits or dies loses its
own clients' connections (the workers drop its requests when its ``subscribe``
calls end) and nothing else; each one's ``view`` calls are its attendance
(``FrontDoorRoll``). On a Ray cluster ``serve`` joined (``ray start``),
``serve`` stopping on a signal stops only its front door while others are
attached, else the service (``shutdown``); ``serve`` dying leaves the control
plane and the workers to the other front doors. On a Ray instance ``serve``
started itself, the service ends with ``serve`` (Ray's processes share its
fate). ``tetriserve stop`` ends it from anywhere. The actor is restarted by Ray when its process dies
(``max_restarts=-1``): its constructor launches the cluster again (the workers
were its own actors and died with it) and the front doors pick up the new
handles from ``view``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tetriserve.common.config import ClusterConfig
from tetriserve.common.lifecycle import LifecycleView
from tetriserve.control_plane.handles import (
    ControlPlaneHandle,
    MonitorHandle,
    SchedulerHandle,
    WorkerHandle,
    kill,
    typed_control_plane,
)
from tetriserve.control_plane.supervisor import Slot

if TYPE_CHECKING:
    from tetriserve.control_plane.launcher import Cluster

logger = logging.getLogger(__name__)

NAME = "control-plane"
LAUNCH_ATTEMPTS = 3  # a restarted control plane may find its old actors' names not yet released
LAUNCH_RETRY_S = 2.0


SloSample = tuple[float, float | None, float | None, float | None]  # TTFT ms, TPOT ms, their objectives (or None)


@dataclass(frozen=True)
class ClusterInfo:
    """What a front door needs once: the config the cluster runs, the model and its served name."""

    config: ClusterConfig
    model_path: str
    served_name: str
    dashboard_url: str


@dataclass(frozen=True)
class ClusterView:
    """The handles a front door calls, as the control plane holds them now."""

    prefill: dict[str, WorkerHandle]
    decode: dict[str, WorkerHandle]
    scheduler: SchedulerHandle
    monitor: MonitorHandle


@dataclass(frozen=True)
class SupervisionState:
    """The supervisor's slots and the elastic controller's lifecycles, for ``status``."""

    slots: dict[str, Slot]
    lives: dict[str, LifecycleView]


class FrontDoorRoll:
    """Which front doors are attached: each one's ``view`` calls (every ``VIEW_S``) are its attendance."""

    def __init__(self, live_s: float = 5.0) -> None:
        self.live_s = live_s  # seen this recently: attached
        self._seen: dict[str, float] = {}

    def seen(self, frontdoor: str, now: float) -> None:
        if frontdoor:
            self._seen[frontdoor] = now

    def leave(self, frontdoor: str) -> None:
        self._seen.pop(frontdoor, None)

    def attached(self, now: float, exclude: str = "") -> list[str]:
        return sorted(f for f, t in self._seen.items() if f != exclude and now - t <= self.live_s)


class ControlPlane:
    """The cluster's owner; a threaded actor (its launch runs on a thread while ``ready`` and ``view`` answer)."""

    def __init__(self, config: ClusterConfig, model_path: str, served_name: str, dashboard_url: str) -> None:
        self.info_ = ClusterInfo(config, model_path, served_name, dashboard_url)
        self._cluster: Cluster | None = None
        self._error: str | None = None
        self._launched = threading.Event()
        self.roll = FrontDoorRoll()
        threading.Thread(target=self._launch, name="control-plane-launch", daemon=True).start()

    def _launch(self) -> None:
        from tetriserve.control_plane.launcher import launch

        info = self.info_
        for attempt in range(1, LAUNCH_ATTEMPTS + 1):
            try:
                cluster = launch(info.config, info.model_path)
                cluster.dashboard_url = info.dashboard_url
                self._cluster = cluster
                break
            except Exception as exc:
                logger.exception("control plane: launch attempt %s failed", attempt)
                self._error = f"{type(exc).__name__}: {exc}"
                if "already taken" not in str(exc) or attempt == LAUNCH_ATTEMPTS:
                    break  # only a name of our previous life, not yet released, is worth another try
                time.sleep(LAUNCH_RETRY_S)
        if self._cluster is not None:
            self._error = None
        self._launched.set()

    # -- what front doors ask --------------------------------------------------------------------------------
    def ready(self, timeout_s: float) -> bool:
        """True once the cluster serves; False if it is still starting after ``timeout_s``; raises why it
        could not start."""
        if not self._launched.wait(timeout_s):
            return False
        if self._error is not None:
            raise RuntimeError(f"the cluster did not start: {self._error}")
        return True

    def info(self) -> ClusterInfo:
        return self.info_

    def view(self, frontdoor: str = "") -> ClusterView | None:
        """The current handles; None while the cluster is starting. A front door's call is its attendance."""
        self.roll.seen(frontdoor, time.monotonic())
        c = self._cluster
        if c is None:
            return None
        return ClusterView(dict(c.prefill), dict(c.decode), c.scheduler, c.monitor)

    def leave(self, frontdoor: str) -> None:
        self.roll.leave(frontdoor)

    def frontdoors(self, exclude: str = "") -> list[str]:
        """The front doors attached now, but ``exclude``."""
        return self.roll.attached(time.monotonic(), exclude)

    def supervision_state(self) -> SupervisionState:
        return self._started().supervision_state()

    def flip(self, worker_id: str, role: str) -> str:
        return str(self._started().flip(worker_id, role))

    def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return list(self._started().scale(prefill, decode))

    def observe_slo_many(self, samples: list[SloSample]) -> None:
        """Requests that ended normally at a front door, in order (``RemoteCluster.observe_slo``)."""
        if self._cluster is not None:
            for sample in samples:
                self._cluster.observe_slo(*sample)

    def shutdown(self) -> None:
        """Stop supervision and every actor of the cluster (the service's end; the caller kills this actor)."""
        self._launched.wait(60)
        if self._cluster is not None:
            self._cluster.shutdown(leave_ray=True)
            self._cluster = None

    def _started(self) -> Cluster:
        if self._cluster is None:
            raise ValueError("the cluster is still starting" if self._error is None else self._error)
        return self._cluster


def start_control_plane(
    config: ClusterConfig, model_path: str, served_name: str, dashboard_url: str
) -> ControlPlaneHandle:
    """Create the detached control-plane actor (Ray must be initialised); refuses when one already runs in the
    namespace, since two would launch two sets of workers under the same names."""
    import ray

    try:
        ray.get_actor(NAME, namespace=config.namespace)
    except ValueError:
        pass
    else:
        raise ValueError(
            f"a tetriserve control plane already runs in Ray namespace {config.namespace!r}: add a front door to it "
            f"with `tetriserve frontdoor --address ...`, or pick another namespace"
        )
    return typed_control_plane(
        ray.remote(ControlPlane)
        .options(
            name=NAME,
            namespace=config.namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=64,
            max_restarts=-1,
        )
        .remote(config, model_path, served_name, dashboard_url)
    )


def stop_control_plane(handle: ControlPlaneHandle, timeout_s: float = 60.0) -> None:
    """The service's end: the control plane stops supervision and kills its actors, then itself."""
    import ray

    try:
        ray.get(handle.shutdown.remote(), timeout=timeout_s)
    except Exception:  # already gone, or stuck: killing it takes its actors along (they are its own)
        logger.warning("control plane: no clean shutdown", exc_info=True)
    try:
        kill(handle, no_restart=True)
    except Exception:
        logger.debug("control plane already gone", exc_info=True)


def find_control_plane(namespace: str) -> ControlPlaneHandle:
    """The running control plane's handle, or a ValueError saying there is none."""
    import ray

    try:
        return typed_control_plane(ray.get_actor(NAME, namespace=namespace))
    except ValueError:
        raise ValueError(
            f"no tetriserve control plane in Ray namespace {namespace!r} on this Ray cluster: start one with "
            f"`tetriserve serve --address ...` (or pass --namespace)"
        ) from None
