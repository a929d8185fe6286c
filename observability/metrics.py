"""The one metrics exporter: stats objects in, Prometheus text and Ray metrics out.

    FrontDoor.metrics (RequestMetrics) ─┐
    admin.status()                      ├─▶ MetricsExporter.snapshot() ─▶ MetricsSnapshot
    admin.worker_stats() (each actor)   │     (cached CACHE_S while the front door's figures stay the same:
    admin.scheduler_counts()           ─┘      scrapers and `tetriserve top` share a round)
         │
         ├─▶ render(): a private prometheus_client registry, one collector over the snapshot
         │            ─▶ text exposition for ``GET /metrics``  (``tetriserve:<name>``)
         └─▶ run_ray(): every RAY_INTERVAL_S through ``ray.util.metrics`` (``tetriserve_<name>``; Ray exports
                        them on each node's metrics port as ``ray_tetriserve_<name>``, for the Ray dashboard's
                        Grafana): counters by their increase, gauges set, histograms fed the front door's
                        observations since the last round

Names and labels come from one table (``metrics_series.SPECS``). A cluster
that does not answer in time leaves the front door's own figures and
``tetriserve:cluster_up 0``. The role and flips of each worker reach Ray
through ``worker_gauges.py`` (the supervision thread) and only the Prometheus
side here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tetriserve.observability.metrics_series import COUNTER, GAUGE, SPECS, SPECS_BY_NAME, Series, series
from tetriserve.observability.metrics_stats import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    ClusterStats,
    HistogramStats,
    MetricsSnapshot,
    worker_stats,
)

logger = logging.getLogger(__name__)

PROM_PREFIX = "tetriserve:"
RAY_PREFIX = "tetriserve_"
CACHE_S = 1.0  # a snapshot serves every scrape within this long, while the front door's figures are unchanged
CLUSTER_TIMEOUT_S = 5.0  # the cluster's answers for one snapshot (under Prometheus's default 10 s scrape timeout)
RAY_INTERVAL_S = 10.0  # Ray reports its metrics about as often
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BOUNDS = {  # the Ray histograms' boundaries: the front door's own
    "time_to_first_token_seconds": TTFT_BUCKETS,
    "inter_token_latency_seconds": ITL_BUCKETS,
    "time_per_output_token_seconds": ITL_BUCKETS,
    "e2e_request_latency_seconds": E2E_BUCKETS,
}


class SnapshotCollector(Collector):
    """Every family of ``SPECS`` (empty ones too, so their HELP and TYPE show), with ``snapshot``'s series."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        by_name: dict[str, list[Series]] = {s.name: [] for s in SPECS}
        for s in series(self.snapshot):
            by_name[s.name].append(s)
        for spec in SPECS:
            name = PROM_PREFIX + spec.name
            labels = list(spec.labels)
            family: Any
            if spec.kind == COUNTER:
                family = CounterMetricFamily(name, spec.help, labels=labels)
            elif spec.kind == GAUGE:
                family = GaugeMetricFamily(name, spec.help, labels=labels)
            else:
                family = HistogramMetricFamily(name, spec.help, labels=labels)
            for s in by_name[spec.name]:
                values = [v for _, v in s.labels]
                if isinstance(s.value, HistogramStats):
                    family.add_metric(values, buckets=s.value.cumulative(), sum_value=s.value.total)
                else:
                    family.add_metric(values, float(s.value))
            yield family


def registry_of(snapshot: MetricsSnapshot) -> CollectorRegistry:
    """A private registry with one collector over ``snapshot`` (nothing global is touched)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return registry


def render(snapshot: MetricsSnapshot) -> bytes:
    """Prometheus text exposition of ``snapshot``."""
    return generate_latest(registry_of(snapshot))


class MetricsExporter:
    """Gathers a front door's and its cluster's stats and publishes them (``GET /metrics``, Ray)."""

    def __init__(self, front: Any, admin: Any, cache_s: float = CACHE_S) -> None:
        """``admin``: the front door's admin client (``frontdoor/backend.py``'s ``AdminClient``)."""
        self.front, self.admin, self.cache_s = front, admin, cache_s
        self._cached: tuple[float, MetricsSnapshot] | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self) -> MetricsSnapshot:
        """The front door's figures as they are now, with a cluster round at most ``cache_s`` old that began after
        them: a cached snapshot serves only while the front door's figures are still the ones it holds (a request
        answered since then is in the next scrape, and so are the workers' figures of it)."""
        async with self._lock:
            front = self.front.metrics.snapshot(self.front.gate)
            cached = self._cached
            if cached is not None and time.monotonic() - cached[0] < self.cache_s and cached[1].frontdoor == front:
                return cached[1]
            snap = MetricsSnapshot(front, await self._cluster())
            self._cached = (time.monotonic(), snap)
            return snap

    async def render(self) -> bytes:
        return render(await self.snapshot())

    async def _cluster(self) -> ClusterStats | None:
        """The cluster's side of a snapshot; None when it does not answer within ``CLUSTER_TIMEOUT_S``."""
        b = self.admin
        raw_fn, counts_fn = getattr(b, "worker_stats", None), getattr(b, "scheduler_counts", None)

        async def nothing() -> dict[str, Any]:
            return {}

        try:
            status, raw, counts = await asyncio.wait_for(
                asyncio.gather(
                    b.status(),
                    raw_fn() if raw_fn is not None else nothing(),
                    counts_fn() if counts_fn is not None else nothing(),
                ),
                CLUSTER_TIMEOUT_S,
            )
        except Exception as exc:
            logger.warning("metrics: the cluster did not answer (%s: %s)", type(exc).__name__, exc)
            return None
        workers = tuple(worker_stats(w, raw.get(w.worker_id)) for w in status.workers)
        router = getattr(self.front, "backend", None)  # this front door's lost attempts are its router's count
        migrations = dict(getattr(router, "migrations", {}) or {})
        return ClusterStats(workers, int(status.requests_in_flight), counts, migrations)

    async def run_ray(self, interval_s: float = RAY_INTERVAL_S) -> None:
        """Publish through ``ray.util.metrics`` at once (which also makes this process's first, slow Ray calls
        to each worker before anyone scrapes) and every ``interval_s`` after, until cancelled (off after a
        failure)."""
        publisher = RayPublisher()
        while True:
            try:
                publisher.publish(await self.snapshot(), self._drained())
            except Exception:  # no metrics agent: the dashboard goes without, the service does not
                logger.exception("metrics: publishing to Ray failed; Ray metrics are off")
                return
            await asyncio.sleep(interval_s)

    def _drained(self) -> dict[str, list[tuple[float, int]]]:
        m = self.front.metrics
        return {
            "time_to_first_token_seconds": m.ttft.drain(),
            "inter_token_latency_seconds": m.itl.drain(),
            "time_per_output_token_seconds": m.tpot.drain(),
            "e2e_request_latency_seconds": m.e2e.drain(),
        }


class RayPublisher:
    """Writes series through ``ray.util.metrics`` (made on first use): counters by increase, gauges set."""

    def __init__(self) -> None:
        self._metrics: dict[str, Any] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def _metric(self, name: str) -> Any:
        from ray.util.metrics import Counter, Gauge, Histogram

        metric = self._metrics.get(name)
        if metric is None:
            spec = SPECS_BY_NAME[name]
            keys = spec.labels
            if spec.kind == COUNTER:
                metric = Counter(RAY_PREFIX + name, spec.help, tag_keys=keys)
            elif spec.kind == GAUGE:
                metric = Gauge(RAY_PREFIX + name, spec.help, tag_keys=keys)
            else:
                bounds = list(_BOUNDS[name])
                metric = Histogram(RAY_PREFIX + name, spec.help, boundaries=bounds, tag_keys=keys)
            self._metrics[name] = metric
        return metric

    def publish(self, snapshot: MetricsSnapshot, observations: Mapping[str, Iterable[tuple[float, int]]]) -> None:
        for s in series(snapshot):
            spec = SPECS_BY_NAME[s.name]
            if not spec.ray or isinstance(s.value, HistogramStats):
                continue
            tags = dict(s.labels)
            value = float(s.value)
            if spec.kind == GAUGE:
                self._metric(s.name).set(value, tags=tags)
                continue
            key = (s.name, s.labels)
            last = self._last.get(key, 0.0)
            increase = value - last if value >= last else value  # below the last: the source restarted
            self._last[key] = value
            if increase > 0:
                self._metric(s.name).inc(increase, tags=tags)
        for name, seen in observations.items():
            for value, n in seen:
                for _ in range(n):
                    self._metric(name).observe(value)
