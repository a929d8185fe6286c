"""A simulated cluster for the elastic controller: members that do at once what the actuator orders.

``SimulatedCluster`` is the ``Actuator`` of a real ``Elastic``: a drained worker reports ``draining`` and
idle, a flipped one serves in its new role at once (same life), an added one serves
at once, a removed one is gone. ``tick(now)`` hands the members to the controller, as the supervision
thread does with the monitor's snapshot.
"""

from __future__ import annotations

import time
from typing import Any

from tetriserve.common.flip_config import FlipConfig, ScaleConfig
from tetriserve.control_plane.elastic import Elastic
from tetriserve.control_plane.flip import policy_from_config


class SimulatedCluster:
    def __init__(self, roles: dict[str, str], loads: dict[str, dict[str, float]] | None = None) -> None:
        self.members: dict[str, dict[str, Any]] = {
            wid: {
                "worker_id": wid,
                "role": role,
                "state": "serving",
                "incarnation": 0,
                "load": dict((loads or {}).get(wid, {})),
            }
            for wid, role in roles.items()
        }
        self.calls: list[tuple[Any, ...]] = []
        self.elastic = Elastic(FlipConfig(), ScaleConfig(), self, policy_from_config(FlipConfig()))
        self.tick()

    def tick(self, now: float | None = None) -> None:
        self.elastic.tick(list(self.members.values()), time.monotonic() if now is None else now)

    # -- the actuator ------------------------------------------------------------------------------
    def drain(self, worker_id: str, draining: bool) -> None:
        self.calls.append(("drain", worker_id, draining))
        self.members[worker_id]["state"] = "draining" if draining else "serving"

    def add_worker(self, name: str, role: str, now: float) -> None:
        self.calls.append(("add", name, role))
        self.members[name] = {"worker_id": name, "role": role, "state": "serving", "incarnation": 0, "load": {}}

    def flip(self, name: str, role: str, now: float) -> None:
        self.calls.append(("flip", name, role))
        self.members[name].update(role=role, state="serving")

    def remove_worker(self, name: str) -> None:
        self.calls.append(("remove", name))
        del self.members[name]
