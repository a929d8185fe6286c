"""What the workers use of Ray, declared: the actor handles they call (``handle.method.remote(...)``) and the two
node queries Ray leaves without annotations.

A handle is declared by the methods called through it, each a ``RemoteMethod`` of the arguments the actor's
method takes; what ``remote`` returns (Ray's ``ObjectRef``) is not awaited by these callers, so it stays
``object``. Tests pass fakes of the same shape (``tests/actor_fakes.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from tetriserve.common.load import DecodeLoad, PrefillLoad
    from tetriserve.common.stream import StateEvent

P = ParamSpec("P")
T_co = TypeVar("T_co", covariant=True)


class RemoteMethod(Protocol, Generic[P]):
    """A method of an actor, reached through its handle: ``remote`` queues the call."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> object: ...


class AwaitedMethod(Protocol[T_co]):
    """A method of an actor whose result its caller awaits: ``remote(...)`` returns what resolves to it."""

    def remote(self, *args: object) -> Awaitable[T_co]: ...


class MonitorHandle(Protocol):
    """The ClusterMonitor's actor (``control_plane/cluster_monitor.py``), as workers call it."""

    @property
    def report(self) -> RemoteMethod[[PrefillLoad | DecodeLoad]]: ...

    @property
    def mark_dead(self) -> RemoteMethod[[str, int]]: ...


class SchedulerHandle(Protocol):
    """The GlobalScheduler's actor (``control_plane/global_scheduler.py``): the request table's state events."""

    @property
    def record(self) -> RemoteMethod[[list[StateEvent]]]: ...


class WorkerHandle(Protocol):
    """Another worker's actor (``worker/actor.py``), as the worker a request passed through calls it."""

    @property
    def abort(self) -> RemoteMethod[[str, int | None]]: ...


def node_ip_address() -> str:
    """This Ray node's IP address (``ray.util.get_node_ip_address``)."""
    import ray

    address: Callable[[], str] = ray.util.get_node_ip_address
    return address()


def cluster_nodes() -> list[dict[str, object]]:
    """The Ray cluster's nodes, each as Ray describes it (``ray.nodes``: ``Alive``, ``NodeManagerAddress``, ...)."""
    import ray

    nodes: Callable[[], list[dict[str, object]]] = ray.nodes
    return nodes()
