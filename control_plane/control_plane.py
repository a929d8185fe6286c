"""The control plane as one detached Ray actor that outlives every front door (issue #17, part 5; DESIGN.md §5b).

    tetriserve serve ──▶ ControlPlane  detached, named "control-plane" in the config's namespace
                           └─ launch(): ClusterMonitor, GlobalScheduler, the workers (its own actors)
                              and the Supervision thread that re-creates the dead, flips and scales
    every front door (serve's own, and each ``tetriserve frontdoor --address ...``):
        ControlPlane.info()  once: config, model, served name, dashboard
        ControlPlane.view()  every VIEW_S: the current handles (a re-created worker's, an added one's)
        ─▶ RemoteCluster (``remote_cluster.py``) ─▶ RayBackend: places with the GlobalScheduler and streams
           straight from the workers, as before; flip / scale / status extras go to the ControlPlane

Front doors hold nothing but their own streams: one that exits or dies loses its
own clients' connections (the workers drop its requests when its ``subscribe``
calls end) and nothing else. ``serve`` stopping on a signal shuts the service
down (``shutdown``); ``serve`` dying leaves the control plane and the workers to
the other front doors. The actor is restarted by Ray when its process dies
(``max_restarts=-1``): its constructor launches the cluster again (the workers
were its own actors and died with it) and the front doors pick up the new
handles from ``view``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from tetriserve.common.config import ClusterConfig
from tetriserve.common.lifecycle import LifecycleView
from tetriserve.control_plane.supervisor import Slot

logger = logging.getLogger(__name__)

NAME = "control-plane"
LAUNCH_ATTEMPTS = 3  # a restarted control plane may find its old actors' names not yet released
LAUNCH_RETRY_S = 2.0
ORPHAN_CHECK_S = 2.0


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

    prefill: dict[str, Any]
    decode: dict[str, Any]
    scheduler: Any
    monitor: Any


@dataclass(frozen=True)
class SupervisionState:
    """The supervisor's slots and the elastic controller's lifecycles, for ``status``."""

    slots: dict[str, Slot]
    lives: dict[str, LifecycleView]


class FrontDoorRoll:
    """Which front doors are attached: each one's ``view`` calls (every ``VIEW_S``) are its attendance.

    ``orphaned`` is true once no front door has been seen for ``timeout_s``, counted from the later of the
    last sighting and ``since`` (the cluster's start: a ``serve`` killed while it launched is noticed too)."""

    def __init__(self, timeout_s: float, live_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self.live_s = live_s  # seen this recently: attached
        self._seen: dict[str, float] = {}
        self._last = -math.inf

    def seen(self, frontdoor: str, now: float) -> None:
        if frontdoor:
            self._seen[frontdoor] = now
            self._last = now

    def leave(self, frontdoor: str) -> None:
        self._seen.pop(frontdoor, None)

    def attached(self, now: float, exclude: str = "") -> list[str]:
        return sorted(f for f, t in self._seen.items() if f != exclude and now - t <= self.live_s)

    def orphaned(self, now: float, since: float) -> bool:
        return not self.attached(now) and now - max(self._last, since) > self.timeout_s


class ControlPlane:
    """The cluster's owner; a threaded actor (its launch runs on a thread while ``ready`` and ``view`` answer).

    ``owner``: the front door of the ``serve`` that started the Ray instance this runs on for itself ("": a
    Ray cluster ``serve`` joined). On such a private instance, when no front door has been attached for
    ``config.orphan_timeout_s`` the service stops, and the Ray instance with it; ``tetriserve stop`` stops the
    instance too once its ``serve`` is gone (a live ``serve`` stops it itself as it exits)."""

    def __init__(
        self, config: ClusterConfig, model_path: str, served_name: str, dashboard_url: str, owner: str = ""
    ) -> None:
        self.info_ = ClusterInfo(config, model_path, served_name, dashboard_url)
        self._cluster: Any = None
        self._error: str | None = None
        self._launched = threading.Event()
        self._launched_at = math.inf
        self.roll = FrontDoorRoll(config.orphan_timeout_s)
        threading.Thread(target=self._launch, name="control-plane-launch", daemon=True).start()
        self.owner = owner
        if owner:
            threading.Thread(target=self._watch_orphan, name="control-plane-orphan", daemon=True).start()

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
        self._launched_at = time.monotonic()
        self._launched.set()

    def _watch_orphan(self) -> None:
        while not self.roll.orphaned(time.monotonic(), self._launched_at):
            time.sleep(ORPHAN_CHECK_S)
        logger.warning(
            "control plane: no front door for %.0f s (serve is gone): stopping the service and its Ray instance",
            self.roll.timeout_s,
        )
        self.shutdown()
        stop_this_ray_instance()

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

    def observe_slo(
        self, ttft_ms: float, tpot_ms: float | None, ttft_slo_ms: float | None, tbt_slo_ms: float | None
    ) -> None:
        if self._cluster is not None:
            self._cluster.observe_slo(ttft_ms, tpot_ms, ttft_slo_ms, tbt_slo_ms)

    def stop(self, stop_ray: bool) -> None:
        """``shutdown``; with ``stop_ray``, also the private Ray instance this runs on if its ``serve`` is gone
        (a moment later, so that this call answers first)."""
        self.shutdown()
        if stop_ray and self.owner and self.owner not in self.roll.attached(time.monotonic()):
            logger.warning("control plane: stopping the Ray instance its serve started (serve is gone)")
            threading.Timer(1.0, stop_this_ray_instance).start()

    def shutdown(self) -> None:
        """Stop supervision and every actor of the cluster (the service's end; the caller kills this actor)."""
        self._launched.wait(60)
        if self._cluster is not None:
            self._cluster.shutdown(leave_ray=True)
            self._cluster = None

    def _started(self) -> Any:
        if self._cluster is None:
            raise ValueError("the cluster is still starting" if self._error is None else self._error)
        return self._cluster


def stop_this_ray_instance() -> None:
    """Stop the Ray instance this process runs in, as ``ray stop`` would but for this one only: every process
    whose command line names its session directory (GCS, raylet, dashboard, agents; workers go with the raylet)."""
    import os

    import psutil
    import ray

    session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.info["pid"] != me and session_dir in " ".join(proc.info["cmdline"] or ()):
                proc.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    os._exit(0)  # the raylet's end takes this worker along anyway


def start_control_plane(
    config: ClusterConfig, model_path: str, served_name: str, dashboard_url: str, owner: str = ""
) -> Any:
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
    return (
        ray.remote(ControlPlane)
        .options(
            name=NAME,
            namespace=config.namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=64,
            max_restarts=-1,
        )
        .remote(config, model_path, served_name, dashboard_url, owner)
    )


def stop_control_plane(handle: Any, timeout_s: float = 60.0, stop_ray: bool = False) -> None:
    """The service's end: the control plane stops supervision and kills its actors, then itself (``stop_ray``:
    and the private Ray instance of a ``serve`` that is gone)."""
    import ray

    try:
        ray.get(handle.stop.remote(stop_ray), timeout=timeout_s)
    except Exception:  # already gone, or stuck: killing it takes its actors along (they are its own)
        logger.warning("control plane: no clean shutdown", exc_info=True)
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        logger.debug("control plane already gone", exc_info=True)


def find_control_plane(namespace: str) -> Any:
    """The running control plane's handle, or a ValueError saying there is none."""
    import ray

    try:
        return ray.get_actor(NAME, namespace=namespace)
    except ValueError:
        raise ValueError(
            f"no tetriserve control plane in Ray namespace {namespace!r} on this Ray cluster: start one with "
            f"`tetriserve serve --address ...` (or pass --namespace)"
        ) from None
