"""Backpressure at the front door: a request is admitted only if it is expected to start within a bound.

    check() (before tokenizing) / admit(request) ─▶
        queued + 1 ≤ max(min_queue, rate · max_wait_s)  and  in flight < max_inflight ?
        yes ─▶ Ticket (queued) ── its second token, or its finish ──▶ started ── stream ends ──▶ released
        no  ─▶ Overloaded(retry_after_s): HTTP 429 + Retry-After, gRPC RESOURCE_EXHAUSTED

``queued`` counts the requests this front door admitted that have not started
decoding (no second token yet: they wait for a prefill, a KV transfer or a decode
slot). ``rate`` is the service's start rate while it has a queue: requests started
per second of time during which at least one request waited, both aged by that
busy time alone with a time constant of ``RATE_TAU_S``, so it measures what the
cluster can do when busy and remembers it across idle spells (a burst after a
quiet minute meets the last busy rate, not the quiet one). Expected wait = queued / rate (Little's law); a
request beyond ``rate · max_wait_s`` would wait longer than the bound and is
refused at once, with ``Retry-After`` the time the excess needs to drain. Before
any rate is known, or where the bound allows less, ``min_queue`` requests may
still wait, so a cold service takes a burst and a slow one is not starved.
``max_inflight`` caps admitted requests in all states as a backstop.

``close()`` starts a drain: every later ``admit`` raises ``Draining`` (HTTP 503,
gRPC UNAVAILABLE: a client goes to another replica) while admitted requests run on.

A pure policy: the caller passes the clock; tests drive it without a cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tetriserve.common.admission_config import RETRY_AFTER_MAX_S, AdmissionConfig

RATE_TAU_S = 30.0  # busy seconds over which the start rate is averaged


class Overloaded(Exception):
    """The request would wait longer than the bound: refuse it, and say when to come back."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class Draining(Exception):
    """The front door is shutting down: it admits nothing new."""


@dataclass
class Ticket:
    """One admitted request: ``start`` when it decodes, ``release`` when its stream ends (both idempotent)."""

    gate: AdmissionGate
    started: bool = False
    released: bool = False

    def start(self, now: float) -> None:
        if not self.started and not self.released:
            self.started = True
            self.gate._on_start(now)

    def release(self, now: float) -> None:
        if not self.released:
            self.released = True
            self.gate._on_release(self, now)


@dataclass
class AdmissionGate:
    limits: AdmissionConfig = field(default_factory=AdmissionConfig)
    queued: int = 0  # admitted, not started
    inflight: int = 0  # admitted, not released
    refused: int = 0
    closed: bool = False
    _busy_s: float = 0.0  # decayed seconds with a queue
    _starts: float = 0.0  # decayed starts during those seconds
    _last: float | None = None

    @property
    def rate(self) -> float | None:
        """Requests started per busy second, once a second of busy time is seen."""
        return self._starts / self._busy_s if self._busy_s >= 1.0 else None

    def allowed_queue(self) -> int:
        rate = self.rate
        by_rate = 0 if rate is None else math.floor(rate * self.limits.max_wait_s)
        return max(self.limits.min_queue, by_rate)

    def expected_wait_s(self) -> float | None:
        rate = self.rate
        return None if rate is None or rate <= 0 else self.queued / rate

    def admit(self, now: float) -> Ticket:
        """A ticket for one more request, or ``Overloaded`` / ``Draining``."""
        self.check(now)
        self.queued += 1
        self.inflight += 1
        return Ticket(self)

    def check(self, now: float) -> None:
        """Raise what ``admit`` would raise now, without admitting: a gateway refuses before it tokenizes."""
        if self.closed:
            raise Draining("the service is shutting down and admits no new requests; retry on another replica")
        self._advance(now)
        allowed = self.allowed_queue()
        if self.queued + 1 <= allowed and self.inflight < self.limits.max_inflight:
            return
        self.refused += 1
        rate = self.rate
        excess = max(1, self.queued + 1 - allowed)
        retry = 1 if rate is None or rate <= 0 else math.ceil(excess / rate)
        wait = self.expected_wait_s()
        why = (
            f"{self.inflight} requests in flight (max_inflight {self.limits.max_inflight})"
            if self.inflight >= self.limits.max_inflight
            else f"{self.queued} requests waiting to start"
            + (f", about {wait:.0f} s of work" if wait is not None else "")
            + f" (admission.max_wait_s {self.limits.max_wait_s:g})"
        )
        raise Overloaded(f"service overloaded: {why}; retry later", min(RETRY_AFTER_MAX_S, max(1, retry)))

    def close(self) -> None:
        """Admit nothing more (a drain); what was admitted runs on."""
        self.closed = True

    def _on_start(self, now: float) -> None:
        self._advance(now)
        self.queued -= 1
        self._starts += 1.0

    def _on_release(self, ticket: Ticket, now: float) -> None:
        self._advance(now)
        if not ticket.started:
            self.queued -= 1
        self.inflight -= 1

    def _advance(self, now: float) -> None:
        """Add the busy time since the last event (if a request waited) and age the rate's sums by it."""
        if self._last is not None and now > self._last and self.queued > 0:
            dt = now - self._last  # busy time: only it ages the sums, so an idle spell keeps them
            decay = math.exp(-dt / RATE_TAU_S)
            self._starts *= decay
            self._busy_s = self._busy_s * decay + dt
        self._last = now if self._last is None else max(self._last, now)

    def stats(self) -> dict[str, float | int | None]:
        return {
            "queued": self.queued,
            "inflight": self.inflight,
            "refused": self.refused,
            "start_rate": self.rate,
            "allowed_queue": self.allowed_queue(),
        }
