"""What a cluster says of its policies, read where users read it: the preset and mode and each worker's policy
items in ``status``, and the ``cluster_info`` and ``policy_decisions`` series of ``GET /metrics`` (rendered by the
front door's exporter over the same admin client, parsed with prometheus_client's parser)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, str, str], float]  # (worker, policy, decision) -> count


@dataclass(frozen=True)
class PolicyView:
    policies: dict[str, dict[str, str]]  # worker -> its policy items in ``status``
    roles: dict[str, str]  # worker -> its role in ``status``
    series: Series  # the /metrics policy_decisions counters
    preset: str  # status's
    mode: str  # status's
    info: tuple[tuple[str, str], ...]  # the /metrics cluster_info series' (preset, mode) labels

    def check_preset(self, preset: str, mode: str) -> None:
        """``status`` and ``/metrics`` both name ``preset`` and ``mode``."""
        assert (self.preset, self.mode) == (preset, mode), (self.preset, self.mode)
        assert self.info == ((preset, mode),), self.info

    def admitting(self) -> list[str]:
        """The workers that admit decodes, checked against the mode: the two colocated ones, or the decode one."""
        workers = [w for w, role in self.roles.items() if role != "prefill"]
        assert workers == (["colocated-0", "colocated-1"] if self.mode == "colocated" else ["decode-0"]), workers
        for worker in workers:  # every engine that admits reports what admission costs its thread
            assert {"admission_steps", "admission_mean_us"} <= set(self.policies[worker]), self.policies[worker]
        return workers

    def decided(self, policy: str) -> dict[str, int]:
        """``status``'s ``decided.<policy>.<decision>`` counts, summed over the workers: decision -> count."""
        out: dict[str, int] = {}
        prefix = f"decided.{policy}."
        for items in self.policies.values():
            for key, value in items.items():
                if key.startswith(prefix):
                    decision = key.removeprefix(prefix)
                    out[decision] = out.get(decision, 0) + int(value)
        return out

    def check_decided(self, policy: str) -> dict[str, int]:
        """The policy's decision counts, after checking that it took at least one and that ``/metrics`` exports
        the same count, labelled with the policy's name, for every worker and decision ``status`` shows."""
        decided = self.decided(policy)
        assert sum(decided.values()) > 0, (policy, self.policies)
        for worker, items in self.policies.items():
            for key, value in items.items():
                if key.startswith(f"decided.{policy}."):
                    exported = self.series.get((worker, policy, key.removeprefix(f"decided.{policy}.")), 0.0)
                    assert exported == int(value), (worker, key, value, exported)
        return decided


def policy_view(cluster: Any) -> PolicyView:
    """The status and the /metrics decision series of ``cluster`` (a launcher handle) as they are now."""
    from tetriserve.frontdoor.ray_admin import RayAdmin
    from tetriserve.observability.metrics import MetricsExporter
    from tetriserve.observability.request_metrics import RequestMetrics

    class Front:
        metrics = RequestMetrics()
        gate = None

    admin = RayAdmin(cluster, "tiny-llama")

    async def both() -> tuple[Any, bytes]:
        return await admin.status(), await MetricsExporter(Front(), admin, cache_s=0.0).render()

    status, text = asyncio.run(both())
    series: Series = {}
    info: list[tuple[str, str]] = []
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "tetriserve:policy_decisions_total":
                series[(labels["worker"], labels["policy"], labels["decision"])] = sample.value
            elif sample.name == "tetriserve:cluster_info" and sample.value == 1:
                info.append((labels["preset"], labels["mode"]))
    return PolicyView(
        {w.worker_id: dict(w.policy) for w in status.workers},
        {w.worker_id: w.role for w in status.workers},
        series,
        status.preset,
        status.mode,
        tuple(info),
    )
