"""The cluster as the front door's Ray side reads it; the actors' handles are ``control_plane/handles.py``'s.

``ClusterHandles`` is what ``RayBackend`` and ``RayAdmin`` read of a cluster: a launched ``Cluster``
(``control_plane/launcher.py``) or a ``RemoteCluster`` (the detached control plane's, ``remote_cluster.py``).
``Control`` is the control plane's calls a front door makes (``LocalControl``, ``RemoteCluster``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tetriserve.common.config import ClusterConfig
    from tetriserve.control_plane.control_plane import SupervisionState
    from tetriserve.control_plane.handles import MonitorHandle, SchedulerHandle, WorkerHandle


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
