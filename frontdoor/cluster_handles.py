"""The cluster as the front door's Ray side calls it: the actors' methods it uses, as protocols.

A Ray actor handle's method is called as ``handle.method.remote(...)``; the call returns an ``ObjectRef``
(awaited, or passed to ``ray.get``), or for a streaming method (``Worker.subscribe``) an async iterable of
them. ``RemoteMethod[[args], result]`` and ``StreamingMethod[[args], item]`` say which, per method; the
actors' own classes are the implementations (``worker/actor.py``, ``control_plane/global_scheduler.py``,
``control_plane/cluster_monitor.py``, ``control_plane/control_plane.py``).

``ClusterHandles`` is what ``RayBackend`` and ``RayAdmin`` read of a cluster: a launched ``Cluster``
(``control_plane/launcher.py``) or a ``RemoteCluster`` (the detached control plane's, ``remote_cluster.py``).
``Control`` is the control plane's calls a front door makes (``LocalControl``, ``RemoteCluster``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from typing import TYPE_CHECKING, NotRequired, ParamSpec, Protocol, TypedDict, TypeVar

if TYPE_CHECKING:
    from ray import ObjectRef

    from tetriserve.common.config import ClusterConfig
    from tetriserve.common.request import Request
    from tetriserve.common.stream import Heartbeat, Placement, PlacementRequest, StateEvent
    from tetriserve.control_plane.control_plane import ClusterInfo, ClusterView, SloSample, SupervisionState

P = ParamSpec("P")
R = TypeVar("R")

PolicyValue = int | str  # a policy key's value as a worker's ``set_policy`` takes it (``policy_admin``)


class RemoteMethod(Protocol[P, R]):
    """An actor method: ``remote`` starts the call; its ``ObjectRef`` gives the result."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]: ...


class StreamingMethod(Protocol[P, R]):
    """A streaming actor method (Ray's ``num_returns="streaming"``): one ``ObjectRef`` per item it yields."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterable[ObjectRef[R]]: ...


class WorkerHandle(Protocol):
    """A worker actor (``worker/actor.py``), prefill or decode, as a front door calls it."""

    @property
    def subscribe(self) -> StreamingMethod[[str, str], Heartbeat]:
        """(subscriber, address): the worker's heartbeats for that front door; fails when the worker is gone."""
        ...

    @property
    def attach_intake(self) -> RemoteMethod[[str, str, bytes], bool]:
        """(subscriber, address, route): False when the worker has no subscription of that front door yet."""
        ...

    @property
    def submit(self) -> RemoteMethod[[Request, str], None]: ...

    @property
    def abort(self) -> RemoteMethod[[str, int], bool]: ...

    @property
    def stats(self) -> RemoteMethod[[], Mapping[str, object]]: ...

    @property
    def policies(self) -> RemoteMethod[[], Mapping[str, str]]: ...

    @property
    def set_policy(self) -> RemoteMethod[[dict[str, PolicyValue]], Mapping[str, str]]: ...


class SchedulerStatus(TypedDict):
    """``GlobalScheduler.status()``."""

    in_flight: int
    counts: dict[str, int]
    at: float


class SchedulerHandle(Protocol):
    """The GlobalScheduler actor (``control_plane/global_scheduler.py``)."""

    @property
    def status(self) -> RemoteMethod[[], SchedulerStatus]: ...

    @property
    def place_many(self) -> RemoteMethod[[list[PlacementRequest]], list[Placement]]: ...

    @property
    def record(self) -> RemoteMethod[[list[StateEvent]], None]: ...


class Member(TypedDict):
    """One worker in ``ClusterMonitor.snapshot()`` (a worker still starting has only the required keys)."""

    worker_id: str
    role: str
    state: str
    load: dict[str, float]
    incarnation: NotRequired[int]
    address: NotRequired[str]
    heartbeat_age_s: NotRequired[float | None]


class MonitorHandle(Protocol):
    """The ClusterMonitor actor (``control_plane/cluster_monitor.py``)."""

    @property
    def snapshot(self) -> RemoteMethod[[], list[Member]]: ...

    @property
    def mark_dead(self) -> RemoteMethod[[str, int], None]: ...


class Control(Protocol):
    """The control plane's calls a front door makes: status extras, flips, scaling, SLO observations."""

    async def supervision_state(self) -> SupervisionState: ...

    async def flip(self, worker_id: str, role: str) -> str: ...

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]: ...

    def observe_slo(
        self, ttft_ms: float, tpot_ms: float | None, ttft_slo_ms: float | None, tbt_slo_ms: float | None
    ) -> None: ...


class ClusterHandles(Protocol):
    """What the front door's Ray side reads of a cluster (``control()``, where it has one, is read by name)."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def model_path(self) -> str: ...

    @property
    def dashboard_url(self) -> str: ...

    @property
    def prefill(self) -> Mapping[str, WorkerHandle]: ...

    @property
    def decode(self) -> Mapping[str, WorkerHandle]: ...

    @property
    def scheduler(self) -> SchedulerHandle: ...

    @property
    def monitor(self) -> MonitorHandle: ...


class ViewMethod(Protocol):
    """``ControlPlane.view``: the handles as the control plane holds them (None before the cluster is up);
    ``frontdoor`` names the front door asking, its attendance."""

    def remote(self, frontdoor: str = "") -> ObjectRef[ClusterView | None]: ...


class ControlPlaneHandle(Protocol):
    """The detached ControlPlane actor (``control_plane/control_plane.py``)."""

    @property
    def ready(self) -> RemoteMethod[[float], bool]: ...

    @property
    def info(self) -> RemoteMethod[[], ClusterInfo]: ...

    @property
    def view(self) -> ViewMethod: ...

    @property
    def leave(self) -> RemoteMethod[[str], None]: ...

    @property
    def frontdoors(self) -> RemoteMethod[[str], list[str]]: ...

    @property
    def supervision_state(self) -> RemoteMethod[[], SupervisionState]: ...

    @property
    def flip(self) -> RemoteMethod[[str, str], str]: ...

    @property
    def scale(self) -> RemoteMethod[[int | None, int | None], list[str]]: ...

    @property
    def observe_slo_many(self) -> RemoteMethod[[list[SloSample]], None]: ...
