"""The cluster's Ray actor handles, typed by the calls made of them: the control plane's and the front door's.

A Ray actor handle's method is called as ``handle.method.remote(...)``; the call returns an ``ObjectRef``
(awaited, or passed to ``ray.get``), or for a streaming method (``Worker.subscribe``) an async iterable of
them. ``RemoteMethod[[args], result]`` and ``StreamingMethod[[args], item]`` say which, per method; a method
called with its optional arguments left out has a protocol of its own (``RegisterMethod``, ``ViewMethod``). The
actors' own classes are the implementations (``worker/actor.py``, ``global_scheduler.py``,
``cluster_monitor.py``, ``control_plane.py``); each handle here has the union of the methods called of it.

Ray's annotations give every method of an ``ActorHandle`` the type ``Never`` (its ``__getattr__``), and an
actor made with ``ray.remote(cls).options(...).remote(...)`` the type "a handle or the class itself", so the
handles here are protocols of the methods called on them. A handle crosses from Ray's types to these in
``typed_*`` and back in ``kill``, the only places that tell the checker what Ray's own types cannot.

The monitor's snapshot rows and the GlobalScheduler's status are ``TypedDict``s: they cross processes as the
plain dicts their actors build.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypedDict, TypeVar, cast

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from tetriserve.common.load import DecodeLoad, PrefillLoad
    from tetriserve.common.request import Request
    from tetriserve.common.stream import Heartbeat, Placement, PlacementRequest, StateEvent
    from tetriserve.control_plane.control_plane import ClusterInfo, ClusterView, SloSample, SupervisionState
    from tetriserve.decode_worker.slices import Order
    from tetriserve.worker.actor import FlipResult

P = ParamSpec("P")
R = TypeVar("R")

PolicyValue = int | str  # a policy key's value as a worker's ``set_policy`` takes it (``frontdoor/policy_admin``)


class RemoteMethod(Protocol[P, R]):
    """An actor method: ``remote`` starts the call; its ``ObjectRef`` gives the result."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]: ...


class StreamingMethod(Protocol[P, R]):
    """A streaming actor method (Ray's ``num_returns="streaming"``): one ``ObjectRef`` per item it yields."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterable[ObjectRef[R]]: ...


class ActorRef(Protocol):
    """One of the cluster's actors, whichever: each keeps a ``sentinel`` call open, which fails when the actor dies."""

    @property
    def sentinel(self) -> RemoteMethod[[], None]: ...


class WorkerHandle(ActorRef, Protocol):
    """A worker actor (``worker/actor.py``), prefill or decode."""

    @property
    def start(self) -> RemoteMethod[[MonitorHandle, SchedulerHandle], str]:
        """(monitor, scheduler): resolves to the KV address of this life once its engine is up."""
        ...

    @property
    def flip(self) -> RemoteMethod[[str, float], FlipResult]:
        """(role, drain timeout in s)."""
        ...

    @property
    def update_decode_view(
        self,
    ) -> RemoteMethod[[list[PrefillLoad | DecodeLoad | None], dict[str, str], dict[str, WorkerHandle]], None]:
        """(the decode workers' loads, the new ones' KV addresses and handles)."""
        ...

    @property
    def rebalance(self) -> RemoteMethod[[Order, str, WorkerHandle], list[str]]:
        """(order, the destination's KV address and handle): the requests moved."""
        ...

    @property
    def observe_many(self) -> RemoteMethod[[list[tuple[int, int]]], None]:
        """(prompt tokens, output tokens) of finished requests: the length predictor's feedback."""
        ...

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


class MemberSnapshot(TypedDict, total=False):
    """One worker as the monitor judges it. ``ClusterMonitor.snapshot`` gives every field; the front door's rows
    for workers added but not yet registered with the monitor give ``worker_id``, ``role``, ``state`` and
    ``load`` only, so a reader takes the others with ``get`` where a row may come from elsewhere."""

    worker_id: str
    role: str
    state: str  # starting | serving | draining | stale | stuck | dead
    incarnation: int
    address: str
    heartbeat_age_s: float | None
    load: dict[str, float]


class SchedulerStatus(TypedDict):
    """``GlobalScheduler.status``."""

    in_flight: int
    counts: dict[str, int]
    placements: dict[str, int]  # placed_by_prefix, prefix_hit_tokens (``control_plane/prefix_placement.py``)
    at: float


class RegisterMethod(Protocol):
    """``ClusterMonitor.register``: a worker, or its new life, or its new role (``load``: its first there); the
    handle is None for a worker whose life is still starting."""

    def remote(
        self,
        worker_id: str,
        role: str,
        handle: WorkerHandle | None,
        address: str,
        incarnation: int = 0,
        load: PrefillLoad | DecodeLoad | None = None,
    ) -> ObjectRef[None]: ...


class MonitorHandle(ActorRef, Protocol):
    """The ClusterMonitor actor (``control_plane/cluster_monitor.py``)."""

    @property
    def start(self) -> RemoteMethod[[SchedulerHandle], None]: ...

    @property
    def snapshot(self) -> RemoteMethod[[], list[MemberSnapshot]]: ...

    @property
    def register(self) -> RegisterMethod: ...

    @property
    def unregister(self) -> RemoteMethod[[str], None]: ...

    @property
    def drain(self) -> RemoteMethod[[str, bool], bool]:
        """(worker, draining): False if the worker is unknown."""
        ...

    @property
    def mark_dead(self) -> RemoteMethod[[str, int], None]:
        """(worker, incarnation)."""
        ...


class SchedulerHandle(ActorRef, Protocol):
    """The GlobalScheduler actor (``control_plane/global_scheduler.py``)."""

    @property
    def status(self) -> RemoteMethod[[], SchedulerStatus]: ...

    @property
    def set_prefill(self) -> RemoteMethod[[str, WorkerHandle], None]: ...

    @property
    def remove_prefill(self) -> RemoteMethod[[str], None]: ...

    @property
    def update_prefill_loads(self) -> RemoteMethod[[list[PrefillLoad | DecodeLoad | None]], None]: ...

    @property
    def place_many(self) -> RemoteMethod[[list[PlacementRequest]], list[Placement]]: ...

    @property
    def record(self) -> RemoteMethod[[list[StateEvent]], None]: ...


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

    @property
    def shutdown(self) -> RemoteMethod[[], None]: ...


def typed_worker(actor: object) -> WorkerHandle:
    """The handle Ray made for a ``Worker``."""
    return cast("WorkerHandle", actor)


def typed_monitor(actor: object) -> MonitorHandle:
    """The handle Ray made for the ``ClusterMonitor``."""
    return cast("MonitorHandle", actor)


def typed_scheduler(actor: object) -> SchedulerHandle:
    """The handle Ray made for the ``GlobalScheduler``."""
    return cast("SchedulerHandle", actor)


def typed_control_plane(actor: object) -> ControlPlaneHandle:
    """The handle Ray made (or found) for the ``ControlPlane``."""
    return cast("ControlPlaneHandle", actor)


def kill(handle: ActorRef | ControlPlaneHandle | None, *, no_restart: bool = True) -> None:
    """``ray.kill(handle)``: what it raises (a handle already gone, or none) reaches the caller."""
    import ray

    ray.kill(cast("ActorHandle[object]", handle), no_restart=no_restart)
