"""Each worker's role, lifecycle and flips as Ray metrics: what the Ray dashboard shows of them.

The supervision thread publishes, once a second, one set of gauges per worker
through Ray's metrics API (``ray.util.metrics``); Ray exports them with its own
metrics on every node's metrics port, prefixed ``ray_``, where the dashboard's
Metrics view (its Prometheus and Grafana) and any Prometheus read them:

    ray_tetriserve_worker_role{worker, role}          1 for the role it plays, 0 for the other
    ray_tetriserve_worker_lifecycle{worker, state}    1 for its state (starting, active, draining, flipping)
    ray_tetriserve_worker_flips{worker}               role changes so far
    ray_tetriserve_worker_last_flip_ms{worker, span}  the latest flip: drain, switch, swap (on the engine,
                                                      TetriInfer's 5–7 ms), order_to_served
    ray_tetriserve_worker_lives{worker}               its incarnation (0 until the supervisor re-creates it)

``gauge_values`` is pure (tested without Ray); ``RayGauges`` only writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tetriserve.common.lifecycle import Lifecycle, LifecycleView
from tetriserve.common.load import Role

if TYPE_CHECKING:
    from ray.util.metrics import Gauge

PREFIX = "tetriserve_worker_"
DESCRIPTIONS = {
    "role": "1 for the role the worker plays now, 0 for the other",
    "lifecycle": "1 for the worker's lifecycle state, 0 for the others",
    "flips": "how often the worker changed role",
    "last_flip_ms": "the worker's latest flip: drain, switch, swap on the engine, order to first request served",
    "lives": "the worker's incarnation (0 until the supervisor re-creates it)",
}
TAG_KEYS = {"role": ("worker", "role"), "lifecycle": ("worker", "state"), "last_flip_ms": ("worker", "span")}


@dataclass(frozen=True)
class GaugeValue:
    name: str  # without PREFIX
    tags: tuple[tuple[str, str], ...]
    value: float


def gauge_values(lifecycles: Mapping[str, LifecycleView], lives: Mapping[str, int]) -> list[GaugeValue]:
    """Every gauge of every worker the elastic controller knows (``lives``: incarnation by worker)."""
    out: list[GaugeValue] = []
    for wid, life in sorted(lifecycles.items()):
        if life.state is Lifecycle.DEAD:
            continue
        out += [GaugeValue("role", (("worker", wid), ("role", r.value)), float(life.role is r)) for r in Role]
        out += [
            GaugeValue("lifecycle", (("worker", wid), ("state", s.value)), float(life.state is s))
            for s in Lifecycle
            if s is not Lifecycle.DEAD
        ]
        out.append(GaugeValue("flips", (("worker", wid),), float(life.flips)))
        out.append(GaugeValue("lives", (("worker", wid),), float(lives.get(wid, 0))))
        timing = life.last_flip
        if timing is not None:
            spans = {
                "drain": timing.drain_s,
                "switch": timing.switch_s,
                "swap": timing.engine_switch_s,
                "order_to_served": timing.first_served_s,
            }
            out += [
                GaugeValue("last_flip_ms", (("worker", wid), ("span", span)), seconds * 1e3)
                for span, seconds in spans.items()
                if seconds is not None
            ]
    return out


class RayGauges:
    """Writes ``GaugeValue``s through ``ray.util.metrics`` (gauges made on first use)."""

    def __init__(self) -> None:
        self._gauges: dict[str, Gauge] = {}

    def publish(self, values: Iterable[GaugeValue]) -> None:
        from ray.util.metrics import Gauge

        for v in values:
            gauge = self._gauges.get(v.name)
            if gauge is None:
                keys = TAG_KEYS.get(v.name, ("worker",))
                gauge = self._gauges[v.name] = Gauge(PREFIX + v.name, DESCRIPTIONS[v.name], tag_keys=keys)
            gauge.set(v.value, tags=dict(v.tags))
