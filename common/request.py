"""The request model: one ordered state enum and a timestamped event log.

Lifecycle::

    QUEUED ─▶ PREFILLING ─▶ TRANSFERRING ─▶ DECODE_QUEUED ─▶ DECODING ─▶ FINISHED_*
                               ▲                   ▲            │
                               │                   └─PREEMPTED◀─┤
                               └─── moved to another decode ◀───┘  (SCLS slice, §7)
    any non-finished state ─▶ FINISHED_ABORTED | FINISHED_ERROR

Every transition appends a timestamped ``RequestEvent``, so a request's history (queueing, transfer,
decoding) reads from its events. The latencies clients see (TTFT, TBT, end to end) are measured once, at the
front door (``observability/request_metrics.py``).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from tetriserve.common.length import LengthEstimate

MAX_LOGPROBS = 20  # top alternatives per position a request may ask for (vLLM's default max_logprobs)


class RequestState(enum.IntEnum):
    QUEUED = 0
    PREFILLING = 1
    TRANSFERRING = 2
    DECODE_QUEUED = 3
    DECODING = 4
    PREEMPTED = 5
    FINISHED_STOPPED = 6
    FINISHED_LENGTH = 7
    FINISHED_ABORTED = 8
    FINISHED_ERROR = 9

    @property
    def finished(self) -> bool:
        return self >= RequestState.FINISHED_STOPPED


_ALLOWED: dict[RequestState, frozenset[RequestState]] = {
    RequestState.QUEUED: frozenset({RequestState.PREFILLING}),
    RequestState.PREFILLING: frozenset(
        {RequestState.TRANSFERRING, RequestState.FINISHED_STOPPED, RequestState.FINISHED_LENGTH}
    ),
    RequestState.TRANSFERRING: frozenset({RequestState.DECODE_QUEUED}),
    RequestState.DECODE_QUEUED: frozenset({RequestState.DECODING}),
    RequestState.DECODING: frozenset(  # TRANSFERRING again: moved to another decode worker (SCLS §7)
        {RequestState.PREEMPTED, RequestState.TRANSFERRING, RequestState.FINISHED_STOPPED, RequestState.FINISHED_LENGTH}
    ),
    RequestState.PREEMPTED: frozenset({RequestState.DECODING}),
}


@dataclass(frozen=True)
class SLO:
    """Optional latency objectives in milliseconds (time to first token, time between tokens, job completion)."""

    ttft_ms: float | None = None
    tbt_ms: float | None = None
    jct_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tbt_ms", "jct_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SLO.{name} must be positive when set, got {value}")


@dataclass(frozen=True)
class SamplingSpec:
    """Engine-independent sampling parameters; adapters translate them to vLLM's.

    Every generated token counts as output wherever it was generated (the prefill
    worker's first token too): ``min_tokens``, ``max_tokens`` and the presence /
    frequency penalties see the whole output. ``stop`` strings are matched by the
    front door over the whole text, never by an engine (which sees only its part).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: the sampled token's and the k most likely ones' per position
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    allowed_token_ids: tuple[int, ...] = ()  # when set, only these may be sampled
    include_stop_str_in_output: bool = False  # the front door's: send the stop string that ended the text
    skip_special_tokens: bool = True  # the front door's: leave special tokens out of the text

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a positive number, got {self.repetition_penalty}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")


@dataclass(frozen=True)
class RequestEvent:
    state: RequestState
    at: float
    detail: str = ""


@dataclass
class Request:
    """A request's identity, inputs and lifecycle. Change ``state`` only through ``advance``/``finish``."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    slo: SLO = field(default_factory=SLO)
    priority: int = 0
    arrival_time: float = field(default_factory=time.time)
    length_estimate: LengthEstimate | None = None
    prefill_worker: str | None = None
    decode_worker: str | None = None
    finish_reason: str | None = None
    events: list[RequestEvent] = field(default_factory=list)
    attempt: int = 0  # placement attempt: chunks of an earlier one are stale
    resume: tuple[int, ...] = ()  # output tokens the client already has (a migrated request goes on after them)
    # W3C traceparent of the front door's span of it (``observability/tracing.py``); None: untraced
    trace: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        if not self.events:
            self.events.append(RequestEvent(RequestState.QUEUED, self.arrival_time))

    @property
    def state(self) -> RequestState:
        return self.events[-1].state

    @property
    def kv_key(self) -> str:
        """The key its prompt's KV travels under: one per attempt, so a migrated request never meets the KV of
        the attempt it replaces."""
        return self.key_of(self.request_id, self.attempt)

    @staticmethod
    def key_of(request_id: str, attempt: int) -> str:
        return request_id if attempt == 0 else f"{request_id}@{attempt}"

    def advance(self, new: RequestState, detail: str = "", at: float | None = None) -> None:
        """Move to ``new``; raises ``ValueError`` on a transition the lifecycle does not allow."""
        if new.finished:
            self.finish(new, detail, at)
            return
        if new not in _ALLOWED.get(self.state, frozenset()):
            raise ValueError(f"request {self.request_id}: illegal transition {self.state.name} -> {new.name}")
        self.events.append(RequestEvent(new, time.time() if at is None else at, detail))

    def finish(self, final: RequestState, reason: str = "", at: float | None = None) -> None:
        """Finish the request; finishing twice keeps the first outcome."""
        if not final.finished:
            raise ValueError(f"{final.name} is not a finished state")
        if self.state.finished:
            return
        if final in (RequestState.FINISHED_STOPPED, RequestState.FINISHED_LENGTH) and final not in _ALLOWED.get(
            self.state, frozenset()
        ):
            raise ValueError(
                f"request {self.request_id}: illegal transition {self.state.name} -> {final.name} "
                "(cannot finish normally)"
            )
        self.finish_reason = reason or final.name.removeprefix("FINISHED_").lower()
        self.events.append(RequestEvent(final, time.time() if at is None else at, reason))

    def observe(self, state: RequestState, at: float, detail: str = "") -> None:
        """Record a transition reported by a worker, in time order and without the lifecycle checks of
        ``advance``: reports from different processes arrive out of order. Nothing follows a finish."""
        if self.state.finished:
            return
        event = RequestEvent(state, at, detail)
        pos = len(self.events)
        while pos > 1 and self.events[pos - 1].at > at:
            pos -= 1
        self.events.insert(pos, event)
        if state.finished:
            del self.events[pos + 1 :]
            self.finish_reason = detail or state.name.removeprefix("FINISHED_").lower()

    def observe_late(self, state: RequestState, at: float, detail: str = "") -> None:
        """A transition reported after the request finished that happened before it did (workers report in
        batches, the front door's finish may come first): put it in its place in the history."""
        if state.finished or not self.state.finished or at > self.events[-1].at:
            return
        pos = len(self.events) - 1
        while pos > 1 and self.events[pos - 1].at > at:
            pos -= 1
        self.events.insert(pos, RequestEvent(state, at, detail))

    def first_time(self, state: RequestState) -> float | None:
        """Timestamp of the first entry into ``state``, or ``None``."""
        return next((e.at for e in self.events if e.state == state), None)
