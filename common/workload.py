"""Benchmark workloads: TetriInfer's request classes (§5.1), arrival processes and phase-changing mixes.

TetriInfer §5.1 sorts requests by prompt and output length: a *heavy prefill* has more than 512 prompt
tokens, a *heavy decode* more than 128 output tokens, giving LPLD, LPHD, HPLD and HPHD, plus a MIXED
workload drawn from the whole dataset; each class runs 128 requests. §3.5 flips instances between
prefill and decode when the mix changes, which :func:`phase_changing` provokes. How the pieces compose::

    sharegpt_pool / synthetic_pool ──▶ pool: list[Sample] ──by_class(cls, n)──▶ samples ─┐
    poisson / uniform / bursts / trace_replay ──▶ arrival offsets (s) ─────────────────────┤
                                        Phase(name, cls, count, rate, arrival, slo) ─────────┤
                                                               build_workload(pool, phases, seed)
                                                                                             ▼
    Workload(requests: WorkloadRequest...) ◀─▶ to_json / from_json (trace files, exact replay)
    measured TTFT/TBT/JCT ──attained(slo, ...)──▶ met? ──goodput(results, duration_s)──▶ req/s

Everything is deterministic given a seed or a ``random.Random``; arrival offsets start at 0.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

from tetriserve.common.request import SLO
from tetriserve.common.sharegpt import first_human_prompt, iter_conversations

logger = logging.getLogger(__name__)

HEAVY_PROMPT_TOKENS = 512  # TetriInfer §5.1: heavy prefill = prompt longer than this
HEAVY_OUTPUT_TOKENS = 128  # TetriInfer §5.1: heavy decode = output longer than this
TETRIINFER_REQUESTS_PER_CLASS = 128  # TetriInfer §5.1 runs this many requests per workload class
_JSON_VERSION = 1
_NO_SLO = SLO()  # the default objectives: none

ArrivalKind = Literal["poisson", "uniform", "burst"]


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


class WorkloadClass(enum.Enum):
    LPLD = "lpld"
    LPHD = "lphd"
    HPLD = "hpld"
    HPHD = "hphd"
    MIXED = "mixed"  # a workload label only: a request is always one of the four above


def classify(
    prompt_tokens: int,
    output_tokens: int,
    heavy_prompt: int = HEAVY_PROMPT_TOKENS,
    heavy_output: int = HEAVY_OUTPUT_TOKENS,
) -> WorkloadClass:
    """The TetriInfer class of one request (heavy = strictly more tokens than the threshold); never MIXED."""
    for name, value in zip(
        ("prompt_tokens", "output_tokens", "heavy_prompt", "heavy_output"),
        (prompt_tokens, output_tokens, heavy_prompt, heavy_output),
        strict=True,
    ):
        _at_least(name, value, 0)
    prefill = "hp" if prompt_tokens > heavy_prompt else "lp"
    return WorkloadClass(prefill + ("hd" if output_tokens > heavy_output else "ld"))


@dataclass(frozen=True)
class Sample:
    """One pool entry: a prompt and its lengths (``output_tokens`` is the target sent as max_tokens)."""

    prompt: str
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _at_least("prompt_tokens", self.prompt_tokens, 1)
        _at_least("output_tokens", self.output_tokens, 1)

    @property
    def cls(self) -> WorkloadClass:
        return classify(self.prompt_tokens, self.output_tokens)


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload; a client sends ``output_tokens`` as max_tokens with ignore_eos."""

    index: int
    arrival_s: float  # offset from the workload's start
    prompt: str  # may be empty when only token counts matter
    prompt_tokens: int
    output_tokens: int
    cls: WorkloadClass
    slo: SLO
    phase: str = ""

    def __post_init__(self) -> None:
        _at_least("index", self.index, 0)
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"arrival_s must be a finite offset >= 0, got {self.arrival_s}")
        _at_least("prompt_tokens", self.prompt_tokens, 1)
        _at_least("output_tokens", self.output_tokens, 1)
        if self.cls is WorkloadClass.MIXED:
            raise ValueError("cls of a request must be one of LPLD, LPHD, HPLD, HPHD, not MIXED")


# ── request sources ──────────────────────────────────────────────────────────────────────────────


def answer_after_first_human(record: Mapping[str, object]) -> str | None:
    """The first gpt turn after the record's first human turn (``first_human_prompt`` vouched that one exists,
    in a list of turns)."""
    turns = record["conversations"]
    if not isinstance(turns, list):
        return None
    start = next(i for i, t in enumerate(turns) if isinstance(t, dict) and t.get("from") == "human")
    for turn in turns[start + 1 :]:
        if isinstance(turn, dict) and turn.get("from") == "gpt":
            value = turn.get("value")
            return value if isinstance(value, str) and value.strip() else None
    return None


def sharegpt_pool(
    count_tokens: Callable[[str], int],
    limit: int | None = None,
    path: str | os.PathLike[str] | None = None,
    max_scan: int | None = None,
) -> list[Sample]:
    """Samples from ShareGPT: each record's first human turn and the gpt answer after it, counted by
    ``count_tokens``. Records without such a pair (or counting 0 tokens) are skipped; ``limit`` caps the
    samples and ``max_scan`` the records read (None: no cap)."""
    for name, cap in (("limit", limit), ("max_scan", max_scan)):
        if cap is not None:
            _at_least(name, cap, 0)
    pool: list[Sample] = []
    scanned = 0
    if limit == 0 or max_scan == 0:
        return pool
    for record in iter_conversations(path):
        scanned += 1
        prompt = first_human_prompt(record)
        answer = answer_after_first_human(record) if prompt is not None else None
        if prompt is not None and answer is not None:
            prompt_tokens, output_tokens = count_tokens(prompt), count_tokens(answer)
            if prompt_tokens >= 1 and output_tokens >= 1:
                pool.append(Sample(prompt, prompt_tokens, output_tokens))
        if (limit is not None and len(pool) >= limit) or (max_scan is not None and scanned >= max_scan):
            break
    logger.info("sharegpt_pool: %d samples from %d records", len(pool), scanned)
    return pool


def synthetic_pool(
    n: int, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], rng: random.Random
) -> list[Sample]:
    """``n`` samples with lengths uniform in the inclusive ranges; the prompt is that many filler words."""
    _at_least("n", n, 0)
    for name, (lo, hi) in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be an inclusive range (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
    out: list[Sample] = []
    for _ in range(n):
        p, o = rng.randint(*prompt_tokens), rng.randint(*output_tokens)
        out.append(Sample(" ".join(["hello"] * p), p, o))
    return out


def by_class(pool: Sequence[Sample], cls: WorkloadClass, n: int, rng: random.Random) -> list[Sample]:
    """``n`` samples of class ``cls`` (MIXED: from the whole pool as is), without replacement when the pool
    has at least ``n`` of them, else with replacement."""
    _at_least("n", n, 0)
    candidates = list(pool) if cls is WorkloadClass.MIXED else [s for s in pool if s.cls is cls]
    if not candidates:
        raise ValueError(f"cls={cls.value}: the pool ({len(pool)} samples) has none of that class")
    if len(candidates) >= n:
        return rng.sample(candidates, n)
    logger.warning("by_class: only %d %s samples for %d requests; drawing with replacement", len(candidates), cls, n)
    return rng.choices(candidates, k=n)


# ── arrival processes: offsets in seconds, non-decreasing, the first at 0 ─────────────────────────


def poisson(rate: float, n: int, rng: random.Random) -> list[float]:
    """A Poisson process of ``rate`` req/s: exponential gaps with mean 1/rate, the first arrival at 0."""
    _positive("rate", rate)
    _at_least("n", n, 0)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate) if i else 0.0
        out.append(t)
    return out


def uniform(rate: float, n: int) -> list[float]:
    """A constant rate: arrivals exactly 1/rate apart."""
    _positive("rate", rate)
    _at_least("n", n, 0)
    return [i / rate for i in range(n)]


def bursts(
    n: int, burst_size: int, burst_interval_s: float, within_s: float = 0.0, rng: random.Random | None = None
) -> list[float]:
    """Groups of ``burst_size`` every ``burst_interval_s``, all at once or spread uniformly over ``within_s``
    (which needs ``rng``); the last group may be smaller."""
    _at_least("n", n, 0)
    _at_least("burst_size", burst_size, 1)
    _positive("burst_interval_s", burst_interval_s)
    if not 0 <= within_s <= burst_interval_s:
        raise ValueError(f"within_s must be in [0, burst_interval_s={burst_interval_s}], got {within_s}")
    if within_s > 0 and rng is None:
        raise ValueError("rng is required when within_s > 0")
    out: list[float] = []
    for first in range(0, n, burst_size):
        t0, size = (first // burst_size) * burst_interval_s, min(burst_size, n - first)
        if rng is None or within_s == 0:
            out.extend([t0] * size)
        else:
            out.extend(sorted(t0 + rng.uniform(0, within_s) for _ in range(size)))
    return out


def trace_replay(timestamps: Sequence[float], speed: float = 1.0) -> list[float]:
    """Recorded arrival times (sorted) as offsets from the first, compressed ``speed`` times."""
    _positive("speed", speed)
    for t in timestamps:
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"timestamps must be finite and >= 0, got {t}")
    ordered = sorted(timestamps)
    return [(t - ordered[0]) / speed for t in ordered]


# ── phases and workloads ───────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Phase:
    """``count`` requests of class ``cls`` at ``rate`` req/s. A burst phase sends ``burst_size`` at a time
    every ``burst_interval_s`` (default burst_size / rate, keeping the mean rate), spread over ``burst_within_s``."""

    name: str
    cls: WorkloadClass
    count: int
    rate: float
    arrival: ArrivalKind = "poisson"
    burst_size: int | None = None
    burst_interval_s: float | None = None
    burst_within_s: float = 0.0
    slo: SLO = field(default_factory=SLO)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        _at_least("count", self.count, 1)
        _positive("rate", self.rate)
        if self.arrival not in get_args(ArrivalKind):
            raise ValueError(f"arrival must be one of {get_args(ArrivalKind)}, got {self.arrival!r}")
        if self.arrival == "burst" and self.burst_size is None:
            raise ValueError("burst_size is required when arrival='burst'")

    @property
    def gap_s(self) -> float:
        """Mean time between arrival events: 1/rate, or the burst interval."""
        if self.arrival != "burst":
            return 1.0 / self.rate
        assert self.burst_size is not None
        return self.burst_interval_s if self.burst_interval_s is not None else self.burst_size / self.rate

    def offsets(self, rng: random.Random) -> list[float]:
        """This phase's arrival offsets from its own start."""
        if self.arrival == "poisson":
            return poisson(self.rate, self.count, rng)
        if self.arrival == "uniform":
            return uniform(self.rate, self.count)
        assert self.burst_size is not None
        return bursts(self.count, self.burst_size, self.gap_s, self.burst_within_s, rng)


@dataclass(frozen=True)
class Workload:
    """An ordered request list: indexes 0..N-1, arrival offsets non-decreasing."""

    requests: tuple[WorkloadRequest, ...]

    def __post_init__(self) -> None:
        for i, r in enumerate(self.requests):
            if r.index != i:
                raise ValueError(f"requests must be indexed 0..N-1 in order; position {i} has index {r.index}")
            if i and r.arrival_s < self.requests[i - 1].arrival_s:
                raise ValueError(f"requests must arrive in order; request {i} arrives before request {i - 1}")

    @property
    def duration_s(self) -> float:
        """Offset of the last arrival (0 for an empty workload)."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    def counts_by_class(self) -> dict[WorkloadClass, int]:
        """Requests per class, the four concrete classes always present (MIXED never)."""
        counts: dict[WorkloadClass, int] = {c: 0 for c in WorkloadClass if c is not WorkloadClass.MIXED}
        for r in self.requests:
            counts[r.cls] += 1
        return counts

    def phases(self) -> list[str]:
        """Phase names in order of first appearance."""
        return list(dict.fromkeys(r.phase for r in self.requests))

    def to_json(self) -> str:
        """A trace file's text: :meth:`from_json` gives back an equal workload (floats round-trip exactly)."""
        rows = [{**asdict(r), "cls": r.cls.value} for r in self.requests]
        return json.dumps({"version": _JSON_VERSION, "requests": rows}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Workload:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != _JSON_VERSION:
            raise ValueError(f"text must be a workload JSON document of version {_JSON_VERSION}")
        try:
            rows = [{**row, "cls": WorkloadClass(row["cls"]), "slo": SLO(**row["slo"])} for row in doc["requests"]]
            return cls(tuple(WorkloadRequest(**row) for row in rows))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"text has a malformed request row: {exc!r}") from exc


def build_workload(pool: Sequence[Sample], phases: Sequence[Phase], seed: int) -> Workload:
    """Phases one after another: each starts one of the previous phase's mean gaps after its last arrival."""
    if not phases:
        raise ValueError("phases must not be empty")
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise ValueError(f"phases must have distinct names, got {names}")
    rng = random.Random(seed)
    requests: list[WorkloadRequest] = []
    for k, phase in enumerate(phases):
        start = requests[-1].arrival_s + phases[k - 1].gap_s if k else 0.0
        samples = by_class(pool, phase.cls, phase.count, rng)
        for s, offset in zip(samples, phase.offsets(rng), strict=True):
            fields = (s.prompt, s.prompt_tokens, s.output_tokens, s.cls, phase.slo, phase.name)
            requests.append(WorkloadRequest(len(requests), start + offset, *fields))
    return Workload(tuple(requests))


def phase_changing(pool: Sequence[Sample], per_phase: int, rate: float, seed: int, slo: SLO = _NO_SLO) -> Workload:
    """Prefill-heavy (HPLD), then decode-heavy (LPHD), then mixed: the shifts that make instances flip (§3.5)."""
    phases = [
        Phase("prefill-heavy", WorkloadClass.HPLD, per_phase, rate, slo=slo),
        Phase("decode-heavy", WorkloadClass.LPHD, per_phase, rate, slo=slo),
        Phase("mixed", WorkloadClass.MIXED, per_phase, rate, slo=slo),
    ]
    return build_workload(pool, phases, seed)


def tetriinfer_workload(
    pool: Sequence[Sample], cls: WorkloadClass, n: int, rate: float, seed: int, slo: SLO = _NO_SLO
) -> Workload:
    """One TetriInfer §5.1 workload: ``n`` (the paper: 128) Poisson requests of class ``cls``, phase ``cls.value``."""
    return build_workload(pool, [Phase(cls.value, cls, n, rate, slo=slo)], seed)


# ── SLO attainment ─────────────────────────────────────────────────────────────────────────────────


def attained(slo: SLO, ttft_ms: float | None, tbt_ms: float | None, jct_ms: float | None) -> bool:
    """True when every objective ``slo`` sets is met (measured and <= the objective); unset ones are ignored."""
    pairs = ((slo.ttft_ms, ttft_ms), (slo.tbt_ms, tbt_ms), (slo.jct_ms, jct_ms))
    return all(measured is not None and measured <= goal for goal, measured in pairs if goal is not None)


def goodput(results: Sequence[tuple[WorkloadRequest, bool]], duration_s: float) -> float:
    """Requests per second that met their SLO over ``duration_s``."""
    _positive("duration_s", duration_s)
    return sum(1 for _, met in results if met) / duration_s
