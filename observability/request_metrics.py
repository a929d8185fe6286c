"""A front door's record of its requests: latency histograms and outcome counts, as ``FrontDoorStats``.

``FrontDoor.stream`` calls it as a request's deltas go out (times from when the gateway received the request)::

    first delta with tokens        ─▶ first_token(ttft_s)                  time_to_first_token_seconds
    every later delta with tokens  ─▶ tokens(gap_s, n)                     inter_token_latency_seconds
                                      (a chunk of n tokens after gap_s counts n gaps of gap_s / n)
    the last delta                 ─▶ finished(reason, ...)                e2e_request_latency_seconds,
                                      time_per_output_token_seconds ((e2e - ttft) / (tokens - 1)),
                                      prompt/generation tokens, success | aborts | errors by reason
    refused (429) / client gone    ─▶ refused(reason) / aborted(reason)

The admission gate counts its own refusals; ``snapshot(gate)`` adds them as ``admission``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Protocol

from tetriserve.observability.metrics_stats import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    FrontDoorStats,
    Histogram,
)


class GateView(Protocol):
    """What ``snapshot`` reads of the front door's ``AdmissionGate``."""

    @property
    def refused(self) -> int: ...

    @property
    def inflight(self) -> int: ...

    @property
    def queued(self) -> int: ...


class RequestMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._lock = threading.Lock()
        self._tokens = Counter[str]()
        self._success = Counter[str]()
        self._aborts = Counter[str]()
        self._errors = Counter[str]()
        self._refusals = Counter[str]()

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def tokens(self, gap_s: float, n: int) -> None:
        if n > 0:
            self.itl.observe(gap_s / n, n)

    def finished(
        self, reason: str, prompt_tokens: int, generated: int, e2e_s: float, ttft_s: float | None, error: str = ""
    ) -> None:
        """A request's stream ended with ``reason`` (stop, length, abort, error; ``error``: what kind)."""
        self.e2e.observe(e2e_s)
        if ttft_s is not None and generated > 1:
            self.tpot.observe((e2e_s - ttft_s) / (generated - 1))
        with self._lock:
            self._tokens["prompt"] += prompt_tokens
            self._tokens["generation"] += generated
            if reason in ("stop", "length"):
                self._success[reason] += 1
            elif reason == "abort":
                self._aborts["client"] += 1
            else:
                self._errors[error or "backend"] += 1

    def aborted(self, reason: str, prompt_tokens: int = 0, generated: int = 0) -> None:
        """The client went away before the end (``disconnect``): its tokens so far still count."""
        with self._lock:
            self._aborts[reason] += 1
            self._tokens["prompt"] += prompt_tokens
            self._tokens["generation"] += generated

    def errored(self, reason: str) -> None:
        """The stream failed outside the backend's own finish (an exception: ``backend_unavailable``, ...)."""
        with self._lock:
            self._errors[reason] += 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self._refusals[reason] += 1

    def snapshot(self, gate: GateView | None = None) -> FrontDoorStats:
        """The stats so far; ``gate`` (the ``AdmissionGate``) adds its refusals and its running / queued counts."""
        with self._lock:
            refusals = dict(self._refusals)
            prompt_tokens, generation_tokens = self._tokens["prompt"], self._tokens["generation"]
            success, aborts, errors = dict(self._success), dict(self._aborts), dict(self._errors)
        running = queued = 0
        if gate is not None:
            refusals["admission"] = refusals.get("admission", 0) + int(gate.refused)
            running, queued = int(gate.inflight) - int(gate.queued), int(gate.queued)
        return FrontDoorStats(
            self.ttft.snapshot(),
            self.itl.snapshot(),
            self.tpot.snapshot(),
            self.e2e.snapshot(),
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            success=success,
            aborts=aborts,
            errors=errors,
            refusals=refusals,
            running=running,
            queued=queued,
        )
