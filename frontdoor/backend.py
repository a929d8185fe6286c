"""The seam between the front doors (gRPC, HTTP) and whatever serves requests, in two parts.

``RequestRouter``: the request path. Front doors tokenize and validate, then hand a ``common.request.Request``
to ``generate`` and detokenize the ``StreamChunk`` stream that comes back (over Ray: ``ray_backend.py``).
``AdminClient``: health, status, the workers' statistics, and the admin calls: ``set_policy`` changes workers'
scheduling policies at run time (``frontdoor/policy_admin.py`` holds the checks both backends share); ``flip``
and ``scale`` change workers' roles and counts (``control_plane.elastic``) (over Ray: ``ray_admin.py``).
Tests use an in-process fake that is both (``ServingBackend``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, TypedDict, runtime_checkable

from tetriserve.common.lifecycle import LifecycleView
from tetriserve.common.request import Request
from tetriserve.common.stream import StreamChunk


@dataclass(frozen=True)
class WorkerStatus:
    worker_id: str
    role: str
    state: str
    load: dict[str, float] = field(default_factory=dict)
    policy: dict[str, str] = field(default_factory=dict)  # empty when the worker did not answer in time
    incarnation: int = 0  # which life of the worker this is (the supervisor counts from 0)
    restarts: int = 0
    health: str = ""  # the monitor's view by its clock: serving, starting, stale, stuck, draining, dead
    lifecycle: str = ""  # the elastic controller's: starting, active, draining, flipping
    flips: int = 0
    last_flip_s: float | None = None  # the latest flip, from its decision until it served in the new role
    last_flip_switch_s: float | None = None  # ... from the end of its drain, as the control plane saw it
    last_flip_engine_s: float | None = None  # ... the role swap on its engine, timed by the worker (the paper's)
    transport: str = ""  # the KV transport its endpoint runs (shm, tcp)


class LifecycleFields(TypedDict, total=False):
    """``WorkerStatus``'s keywords that the elastic controller's view of a worker sets."""

    lifecycle: str
    flips: int
    last_flip_s: float | None
    last_flip_switch_s: float | None
    last_flip_engine_s: float | None


def lifecycle_fields(life: LifecycleView | None) -> LifecycleFields:
    """``WorkerStatus``'s lifecycle keywords from the elastic controller's view of a worker (None: none)."""
    if life is None:
        return {}
    timing = life.last_flip
    return {
        "lifecycle": life.state.value,
        "flips": life.flips,
        "last_flip_s": timing.first_served_s if timing is not None else None,
        "last_flip_switch_s": timing.switch_s if timing is not None else None,
        "last_flip_engine_s": timing.engine_switch_s if timing is not None else None,
    }


@dataclass(frozen=True)
class WorkerPolicy:
    """One worker's scheduling policies, as ``set_policy`` left them."""

    worker_id: str
    role: str
    policy: dict[str, str]


@dataclass(frozen=True)
class ClusterStatus:
    model: str
    workers: tuple[WorkerStatus, ...]
    requests_in_flight: int
    dashboard_url: str = ""
    preset: str = ""  # the config's preset, "" for none
    mode: str = ""  # disaggregated | colocated


class RequestRouter(Protocol):
    """What a front door needs from the cluster per request: the model, and each request's stream."""

    @property
    def model_name(self) -> str: ...

    @property
    def model_path(self) -> str:
        """Directory the tokenizer is loaded from."""
        ...

    @property
    def max_model_len(self) -> int: ...

    def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Stream the request's tokens; the last chunk has ``finish_reason`` set.

        Cancelling the iteration (client gone) must abort the request everywhere. Raises ``Overloaded``
        (``admission.py``) before the first chunk when no worker has room for the request.
        """
        ...

    async def abort(self, request_id: str, reason: str = "abort") -> bool:
        """End a request's stream now (its last chunk has ``reason``) and abort it on the workers; ``False`` if
        it was not in flight. The front door passes ``"stop"`` when it matched a stop string."""
        ...


@runtime_checkable
class AdminClient(Protocol):
    """What the gateways' administration and health checks need from the cluster (the metrics exporter also
    reads ``worker_stats()`` and ``scheduler_counts()`` where an admin client has them: ``RayAdmin``)."""

    async def healthy(self) -> bool: ...

    async def status(self) -> ClusterStatus:
        """Workers with their states, loads and policies; a worker that does not answer has no policy."""
        ...

    async def flip(self, worker_id: str, role: str) -> str:
        """Start flipping ``worker_id`` to ``role`` ("prefill" / "decode"); returns what was started. Raises
        ``LookupError`` for an unknown worker, ``ValueError`` for an order that cannot be carried out now (the
        message says why) and ``common.errors.InvalidRequestError`` for a bad role."""
        ...

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        """Add or remove workers (removals drain first) until each given role has that many; returns what
        was started. Raises ``ValueError`` for counts below the configured minimum."""
        ...

    async def set_policy(self, worker_id: str | None, changes: dict[str, str]) -> list[WorkerPolicy]:
        """Change the policies of one worker, or of every worker of a role; returns them as they now are.

        ``worker_id``: a worker's id, ``"decode"`` for every decode worker, or
        ``None`` / ``""`` / ``"prefill"`` for every prefill worker. Raises
        ``policy_admin.UnknownWorkerError`` for an unknown id and
        ``common.errors.InvalidRequestError`` (field = the offending key) for a
        bad key or value, or a key of the other role.
        """
        ...


class ServingBackend(RequestRouter, AdminClient, Protocol):
    """Both sides of one cluster in one object (the tests' fake backends)."""
