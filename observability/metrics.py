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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tetriserve.observability.metrics_series import COUNTER, GAUGE, SPECS, SPECS_BY_NAME, MetricSpec, Series, series
from tetriserve.observability.metrics_stats import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    ClusterStats,
    HistogramStats,
    MetricsSnapshot,
    WorkerReply,
    WorkerStatusView,
    worker_stats,
)
from tetriserve.observability.request_metrics import GateView, RequestMetrics

if TYPE_CHECKING:
    from ray.util.metrics import Counter, Gauge, Histogram

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
            yield _family(spec, by_name[spec.name])


def _family(spec: MetricSpec, found: Iterable[Series]) -> Metric:
    """``spec``'s family with the series ``found`` of it: a counter or a gauge takes numbers, a histogram
    ``HistogramStats`` (anything else is refused with a TypeError)."""
    name = PROM_PREFIX + spec.name
    labels = list(spec.labels)
    if spec.kind in (COUNTER, GAUGE):
        family = (CounterMetricFamily if spec.kind == COUNTER else GaugeMetricFamily)(name, spec.help, labels=labels)
        for s in found:
            if isinstance(s.value, HistogramStats):
                raise TypeError(f"{spec.name}: a {spec.kind} takes no histogram")
            family.add_metric([v for _, v in s.labels], float(s.value))
        return family
    histogram = HistogramMetricFamily(name, spec.help, labels=labels)
    for s in found:
        if not isinstance(s.value, HistogramStats):
            raise TypeError(f"{spec.name}: a histogram takes no single number")
        histogram.add_metric([v for _, v in s.labels], buckets=s.value.cumulative(), sum_value=s.value.total)
    return histogram


def registry_of(snapshot: MetricsSnapshot) -> CollectorRegistry:
    """A private registry with one collector over ``snapshot`` (nothing global is touched)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return registry


def render(snapshot: MetricsSnapshot) -> bytes:
    """Prometheus text exposition of ``snapshot``."""
    return generate_latest(registry_of(snapshot))


class FrontView(Protocol):
    """What the exporter reads of a front door (``frontdoor/core.py``'s ``FrontDoor``): its request metrics and
    admission gate (and, where it has one, its router's ``migrations``, read by name)."""

    @property
    def metrics(self) -> RequestMetrics: ...

    @property
    def gate(self) -> GateView | None: ...


class ClusterStatusView(Protocol):
    """What the exporter reads of the admin client's ``status()`` (``frontdoor/backend.py``'s ``ClusterStatus``)."""

    @property
    def workers(self) -> Sequence[WorkerStatusView]: ...

    @property
    def requests_in_flight(self) -> int: ...

    @property
    def preset(self) -> str: ...

    @property
    def mode(self) -> str: ...


class AdminView(Protocol):
    """What the exporter needs of the front door's admin client (``frontdoor/backend.py``'s ``AdminClient``);
    ``worker_stats()`` and ``scheduler_counts()`` are read by name, where the client has them."""

    async def status(self) -> ClusterStatusView: ...


class MetricsExporter:
    """Gathers a front door's and its cluster's stats and publishes them (``GET /metrics``, Ray)."""

    def __init__(self, front: FrontView, admin: AdminView, cache_s: float = CACHE_S) -> None:
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

        async def no_stats() -> dict[str, WorkerReply]:
            return {}

        async def no_counts() -> dict[str, int]:
            return {}

        try:
            status, raw, counts = await asyncio.wait_for(
                asyncio.gather(
                    b.status(),
                    raw_fn() if raw_fn is not None else no_stats(),
                    counts_fn() if counts_fn is not None else no_counts(),
                ),
                CLUSTER_TIMEOUT_S,
            )
        except Exception as exc:
            logger.warning("metrics: the cluster did not answer (%s: %s)", type(exc).__name__, exc)
            return None
        workers = tuple(worker_stats(w, raw.get(w.worker_id)) for w in status.workers)
        router = getattr(self.front, "backend", None)  # this front door's lost attempts are its router's count
        migrations = dict(getattr(router, "migrations", {}) or {})
        return ClusterStats(
            workers, int(status.requests_in_flight), counts, migrations, preset=status.preset, mode=status.mode
        )

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
        # by name, each of its spec's kind
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms: dict[str, Histogram] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def _counter(self, name: str) -> Counter:
        from ray.util.metrics import Counter

        metric = self._counters.get(name)
        if metric is None:
            spec = SPECS_BY_NAME[name]
            metric = self._counters[name] = Counter(RAY_PREFIX + name, spec.help, tag_keys=spec.labels)
        return metric

    def _gauge(self, name: str) -> Gauge:
        from ray.util.metrics import Gauge

        metric = self._gauges.get(name)
        if metric is None:
            spec = SPECS_BY_NAME[name]
            metric = self._gauges[name] = Gauge(RAY_PREFIX + name, spec.help, tag_keys=spec.labels)
        return metric

    def _histogram(self, name: str) -> Histogram:
        from ray.util.metrics import Histogram

        metric = self._histograms.get(name)
        if metric is None:
            spec = SPECS_BY_NAME[name]
            bounds = list(_BOUNDS[name])
            metric = self._histograms[name] = Histogram(RAY_PREFIX + name, spec.help, boundaries=bounds,
                                                        tag_keys=spec.labels)  # fmt: skip
        return metric

    def publish(self, snapshot: MetricsSnapshot, observations: Mapping[str, Iterable[tuple[float, int]]]) -> None:
        for s in series(snapshot):
            spec = SPECS_BY_NAME[s.name]
            if not spec.ray or isinstance(s.value, HistogramStats):
                continue
            tags = dict(s.labels)
            value = float(s.value)
            if spec.kind == GAUGE:
                self._gauge(s.name).set(value, tags=tags)
                continue
            key = (s.name, s.labels)
            last = self._last.get(key, 0.0)
            increase = value - last if value >= last else value  # below the last: the source restarted
            self._last[key] = value
            if increase > 0:
                self._counter(s.name).inc(increase, tags=tags)
        for name, seen in observations.items():
            for value, n in seen:
                for _ in range(n):
                    self._histogram(name).observe(value)
