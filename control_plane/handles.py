"""The Ray actor handles the control plane calls, typed by the calls it makes of them.

Ray's annotations give every method of an ``ActorHandle`` the type ``Never`` (its ``__getattr__``), and an
actor made with ``ray.remote(cls).options(...).remote(...)`` the type "a handle or the class itself", so the
handles here are protocols of the methods called on them, each method's ``remote`` giving an ``ObjectRef`` of
what the actor's method returns. A handle crosses from Ray's types to these in ``typed_*`` and back in
``kill``, the only places that tell the checker what Ray's own types cannot.

The monitor's snapshot rows and the GlobalScheduler's status are ``TypedDict``s: they cross processes as the
plain dicts their actors build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar, cast

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from tetriserve.worker.actor import FlipResult

R = TypeVar("R")


class Method(Protocol[R]):
    """One method of an actor handle: ``remote`` sends the call; the ref resolves to what the method returns."""

    def remote(self, *args: object, **kwargs: object) -> ObjectRef[R]: ...


class ActorRef(Protocol):
    """One of the cluster's actors, whichever: each keeps a ``sentinel`` call open, which fails when the actor dies."""

    sentinel: Method[None]


class WorkerHandle(ActorRef, Protocol):
    """A ``worker.actor.Worker``."""

    start: Method[str]  # resolves to the KV address of this life once its engine is up
    flip: Method[FlipResult]
    update_decode_view: Method[None]
    rebalance: Method[list[str]]
    observe_many: Method[None]


class MemberSnapshot(TypedDict, total=False):
    """One worker as the monitor judges it (``ClusterMonitor.snapshot``, which gives every field; a reader
    takes those it needs with ``get`` where a row may come from elsewhere)."""

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
    at: float


class MonitorHandle(ActorRef, Protocol):
    """A ``cluster_monitor.ClusterMonitor``."""

    start: Method[None]
    snapshot: Method[list[MemberSnapshot]]
    register: Method[None]
    unregister: Method[None]
    drain: Method[bool]
    mark_dead: Method[None]


class SchedulerHandle(ActorRef, Protocol):
    """A ``global_scheduler.GlobalScheduler``."""

    status: Method[SchedulerStatus]
    set_prefill: Method[None]
    remove_prefill: Method[None]
    update_prefill_loads: Method[None]


class ControlPlaneHandle(Protocol):
    """The detached ``control_plane.ControlPlane``."""

    shutdown: Method[None]


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
