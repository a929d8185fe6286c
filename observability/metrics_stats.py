"""The stats objects the metrics exporter publishes: plain frozen values, no metrics library.

    FrontDoor ──RequestMetrics.snapshot()──▶ FrontDoorStats   latency histograms, tokens, outcomes (its own view)
    admin.status() + worker_stats()   ─────▶ ClusterStats     per worker: queues, KV, transfers, role, flips,
                                                              length-prediction scores; migrations; the table
    both ──▶ MetricsSnapshot ──▶ observability/metrics.py (Prometheus text, ray.util.metrics)

``Histogram`` keeps fixed buckets (vLLM's bounds, copied so the front door
needs no vLLM) and, for the Ray publisher, a bounded list of the observations
not yet published there.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, Protocol, TypedDict

from tetriserve.common.length_score import LengthScoreStats

# vLLM's bounds (vllm/v1/metrics/buckets.py), so dashboards built for vLLM read ours the same way
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
PENDING_MAX = 10_000  # observations kept for the Ray publisher between two of its rounds


@dataclass(frozen=True)
class HistogramStats:
    """Cumulative observations: ``counts[i]`` fell in (bounds[i-1], bounds[i]]; the last one above every bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus's ``le`` buckets: (upper bound, observations at or below it), ``+Inf`` last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Histogram:
    """Fixed-bucket accumulator; ``observe`` from the event loop, ``snapshot`` / ``drain`` from anywhere."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bounds must increase strictly, got {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0
        self._pending: deque[tuple[float, int]] = deque(maxlen=PENDING_MAX)
        self._lock = threading.Lock()

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (a chunk of ``n`` tokens spreads its gap over them)."""
        if n <= 0:
            return
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += n
            self._total += value * n
            self._pending.append((value, n))

    def snapshot(self) -> HistogramStats:
        with self._lock:
            return HistogramStats(self.bounds, tuple(self._counts), self._total)

    def drain(self) -> list[tuple[float, int]]:
        """The observations since the last drain (at most ``PENDING_MAX``: the oldest go first)."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
            return out


@dataclass(frozen=True)
class FrontDoorStats:
    """What one front door saw of its requests (from its first byte to its last)."""

    ttft: HistogramStats
    itl: HistogramStats
    tpot: HistogramStats
    e2e: HistogramStats
    prompt_tokens: int = 0
    generation_tokens: int = 0
    success: Mapping[str, int] = field(default_factory=dict)  # finished_reason (stop, length) -> requests
    aborts: Mapping[str, int] = field(default_factory=dict)  # client (abort call), disconnect (client gone)
    errors: Mapping[str, int] = field(default_factory=dict)  # backend, unavailable, <exception> ...
    refusals: Mapping[str, int] = field(default_factory=dict)  # admission (the gate), placement (all full)
    running: int = 0  # admitted and streaming
    queued: int = 0  # admitted and not decoding yet


@dataclass(frozen=True)
class WorkerStats:
    """One worker as the control plane and its own ``stats()`` see it; zeros where the worker did not answer."""

    worker: str
    role: str
    state: str = ""
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of its KV blocks in use, 0..1 (vLLM's kv_cache_usage_perc)
    preemptions: int = 0
    prompt_tokens: Mapping[str, int] = field(default_factory=dict)  # computed, cached, external
    generation_tokens: int = 0
    kv_bytes: Mapping[str, int] = field(default_factory=dict)  # sent, received
    kv_transfers: Mapping[str, int] = field(default_factory=dict)  # sent, received, failed
    kv_seconds_sending: float = 0.0
    step_seconds: Mapping[str, float] = field(default_factory=dict)  # wall, cpu: time inside engine steps
    steps: int = 0  # engine steps taken
    borrowed_steps: int = 0  # of them, steps with cores borrowed from idle engines
    step_switches: Mapping[str, int] = field(default_factory=dict)  # slept, preempted: inside engine steps
    flips: int = 0
    restarts: int = 0
    queue_wait_s: float | None = None  # a prefill worker's reported expected queue wait (None: not a prefill worker)
    seconds_per_token: float = 0.0  # and the prefill pace it prices its queue with (0: not measured)
    predictions: Mapping[str, int] = field(default_factory=dict)  # prefill: on_time, late, refined
    handoffs: Mapping[str, int] = field(default_factory=dict)  # prefill: pipelined, whole, offloaded
    decisions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (policy, decision) -> count
    length_score: LengthScoreStats = field(default_factory=LengthScoreStats)
    answered: bool = False  # its ``stats()`` came back in time


@dataclass(frozen=True)
class ClusterStats:
    workers: tuple[WorkerStats, ...] = ()
    requests_in_flight: int = 0  # the GlobalScheduler's table
    scheduler_counts: Mapping[str, int] = field(default_factory=dict)  # admitted, finished, moved, refused, ...
    migrations: Mapping[str, int] = field(default_factory=dict)  # this front door's lost attempts, by cause
    preset: str = ""  # the config's preset ("" for none)
    mode: str = ""  # disaggregated | colocated


@dataclass(frozen=True)
class MetricsSnapshot:
    frontdoor: FrontDoorStats
    cluster: ClusterStats | None = None  # None: the cluster did not answer


class WorkerStatusView(Protocol):
    """What ``worker_stats`` reads of the backend's ``WorkerStatus`` (``frontdoor/backend.py``)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def lifecycle(self) -> str: ...

    @property
    def load(self) -> Mapping[str, float]: ...

    @property
    def flips(self) -> int: ...

    @property
    def restarts(self) -> int: ...


class EngineFigures(Protocol):
    """What ``worker_stats`` reads of a worker's engine stats (its ``stats()["engine"]``)."""

    @property
    def running(self) -> float: ...

    @property
    def waiting(self) -> float: ...

    @property
    def kv_usage(self) -> float: ...

    @property
    def preemptions(self) -> float: ...

    @property
    def generation_tokens(self) -> float: ...

    @property
    def prompt_tokens_computed(self) -> float: ...

    @property
    def prompt_tokens_cached(self) -> float: ...

    @property
    def prompt_tokens_external(self) -> float: ...

    @property
    def step_seconds(self) -> float: ...

    @property
    def step_cpu_seconds(self) -> float: ...

    @property
    def steps(self) -> float: ...

    @property
    def borrowed_steps(self) -> float: ...

    @property
    def step_sleeps(self) -> float: ...

    @property
    def step_preemptions(self) -> float: ...


class TransportFigures(Protocol):
    """What ``worker_stats`` reads of a worker's transport stats (its ``stats()["transport"]``)."""

    @property
    def bytes_sent(self) -> float: ...

    @property
    def bytes_received(self) -> float: ...

    @property
    def transfers_sent(self) -> float: ...

    @property
    def transfers_received(self) -> float: ...

    @property
    def transfers_failed(self) -> float: ...

    @property
    def transfers_pulled(self) -> float: ...

    @property
    def seconds_sending(self) -> float: ...


class WorkerReply(TypedDict, total=False):
    """What ``worker_stats`` reads of a worker's own ``stats()`` (the rest of it is not read here)."""

    engine: EngineFigures | None
    transport: TransportFigures | None
    predictions: Mapping[str, float] | None  # a prefill worker's prediction queue
    handoffs: Mapping[str, float] | None  # a prefill worker's handoffs
    decisions: Mapping[str, Mapping[str, int]] | None  # its policies' decision counts, by policy
    length_score: object  # a ``LengthScoreStats`` where the worker scores length predictions


class _Base(TypedDict):
    """``WorkerStats``'s fields that the backend's status gives."""

    worker: str
    role: str
    state: str
    running: int
    waiting: int
    flips: int
    restarts: int
    queue_wait_s: NotRequired[float]
    seconds_per_token: NotRequired[float]


class _Extra(TypedDict, total=False):
    """``WorkerStats``'s fields that the worker's own ``stats()`` gives."""

    answered: bool
    predictions: Mapping[str, int]
    handoffs: Mapping[str, int]
    decisions: Mapping[tuple[str, str], int]
    kv_usage: float
    preemptions: int
    generation_tokens: int
    prompt_tokens: Mapping[str, int]
    step_seconds: Mapping[str, float]
    steps: int
    borrowed_steps: int
    step_switches: Mapping[str, int]
    kv_bytes: Mapping[str, int]
    kv_transfers: Mapping[str, int]
    kv_seconds_sending: float
    length_score: LengthScoreStats


def worker_stats(status: WorkerStatusView, raw: WorkerReply | None) -> WorkerStats:
    """A ``WorkerStats`` from the backend's ``WorkerStatus`` and the worker's own ``stats()`` (None: no answer).

    Running and waiting come from the worker's load report (a prefill worker's queue sits before its engine),
    the rest from its engine, transport and length-score counters."""
    load = status.load or {}
    base: _Base = {
        "worker": status.worker_id,
        "role": status.role,
        "state": status.lifecycle or status.state,
        "running": int(load.get("running", 0)),
        "waiting": int(load.get("queued", 0)),
        "flips": int(status.flips),
        "restarts": int(status.restarts),
    }
    if "queue_wait_s" in load:  # a prefill worker's
        base["queue_wait_s"] = float(load["queue_wait_s"])
        base["seconds_per_token"] = float(load.get("seconds_per_token", 0.0))
    if raw is None:
        return WorkerStats(**base)
    eng, tx, pred = raw.get("engine"), raw.get("transport"), raw.get("predictions")
    extra: _Extra = {"answered": True}
    if pred:  # a prefill worker's prediction queue
        extra["predictions"] = {k: int(pred.get(k, 0)) for k in _PREDICTIONS}
    if handoffs := raw.get("handoffs"):  # a prefill worker's handoffs, pipelined, whole or offloaded
        extra["handoffs"] = {k: int(v) for k, v in handoffs.items()}
    if decided := raw.get("decisions"):  # its policies' departures from the defaults (common/decisions.py)
        extra["decisions"] = {(p, d): int(n) for p, counts in decided.items() for d, n in counts.items()}
    if eng is not None:
        if not load:  # no load report yet: the engine's own counts
            base["running"], base["waiting"] = int(eng.running), int(eng.waiting)
        extra["kv_usage"] = float(eng.kv_usage)
        extra["preemptions"] = int(eng.preemptions)
        extra["generation_tokens"] = int(eng.generation_tokens)
        extra["prompt_tokens"] = {
            "computed": int(eng.prompt_tokens_computed),
            "cached": int(eng.prompt_tokens_cached),
            "external": int(eng.prompt_tokens_external),
        }
        extra["step_seconds"] = {"wall": float(eng.step_seconds), "cpu": float(eng.step_cpu_seconds)}
        extra["steps"] = int(eng.steps)
        extra["borrowed_steps"] = int(eng.borrowed_steps)
        extra["step_switches"] = {"slept": int(eng.step_sleeps), "preempted": int(eng.step_preemptions)}
    if tx is not None:
        extra["kv_bytes"] = {"sent": int(tx.bytes_sent), "received": int(tx.bytes_received)}
        extra["kv_transfers"] = {
            "sent": int(tx.transfers_sent),
            "received": int(tx.transfers_received),
            "failed": int(tx.transfers_failed),
            "pulled": int(tx.transfers_pulled),
        }
        extra["kv_seconds_sending"] = float(tx.seconds_sending)
    score = raw.get("length_score")
    if isinstance(score, LengthScoreStats):
        extra["length_score"] = score
    return WorkerStats(**base, **extra)


_PREDICTIONS = ("on_time", "late", "refined")
