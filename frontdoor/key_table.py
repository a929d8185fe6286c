"""Who may call the front doors, and how often: the API key table and each key's token bucket (pure).

    "Bearer <key>" ─▶ sha256 ─▶ compared with every known key's digest (hmac.compare_digest, no early exit)
        │ no header / not Bearer      ─▶ MISSING        (HTTP 401, gRPC UNAUTHENTICATED)
        │ no digest matches           ─▶ INVALID        (HTTP 401, gRPC UNAUTHENTICATED)
        ▼
    the key's bucket: take one token ─▶ none left ─▶ RATE_LIMITED(retry_after_s)  (HTTP 429, RESOURCE_EXHAUSTED)
        ▼
    ALLOWED(key name)

A token bucket holds up to ``burst`` tokens and refills at ``rate_per_s``; each request takes one. A key
without a rate is unlimited. The table keeps only SHA-256 digests of the keys, so comparing digests (all of
the same length) is constant-time in the key presented, and a key never appears in memory dumps of it.
No sockets, no Ray: the clock is injected (``time.monotonic`` by default), so tests drive it by hand.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BEARER = "bearer"


class AuthOutcome(enum.Enum):
    ALLOWED = "allowed"
    MISSING = "missing"
    INVALID = "invalid"
    RATE_LIMITED = "rate_limited"


@dataclass(frozen=True)
class AuthResult:
    """What the table says of one request: its outcome, the key's name (when known), when to come back."""

    outcome: AuthOutcome
    key_name: str | None = None
    retry_after_s: float | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome is AuthOutcome.ALLOWED

    def message(self) -> str:
        """The refusal's text, in the words of OpenAI's errors (never the key)."""
        if self.outcome is AuthOutcome.MISSING:
            return (
                "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY; gRPC: 'authorization' metadata)."
            )
        if self.outcome is AuthOutcome.INVALID:
            return "Incorrect API key provided."
        if self.outcome is AuthOutcome.RATE_LIMITED:
            return f"Rate limit reached for API key {self.key_name}: retry after {self.retry_after_whole_s} s."
        return "ok"

    @property
    def retry_after_whole_s(self) -> int:
        """``retry_after_s`` rounded up to whole seconds, at least 1 (the Retry-After header's unit)."""
        return max(1, math.ceil(self.retry_after_s or 0.0))


@dataclass(frozen=True)
class AuthStats:
    """How many requests the table judged, by outcome, since it was built (for the metrics exporter)."""

    allowed: int = 0
    missing: int = 0
    invalid: int = 0
    rate_limited: int = 0


@dataclass(frozen=True)
class KeyEntry:
    """One accepted key: its name, its SHA-256 and its quota (``rate_per_s`` None: unlimited)."""

    name: str
    digest: bytes
    rate_per_s: float | None = None
    burst: int | None = None

    @classmethod
    def of(cls, key: str, name: str, rate_per_s: float | None = None, burst: int | None = None) -> KeyEntry:
        if not key:
            raise ValueError(f"api key {name}: must not be empty")
        if rate_per_s is not None and not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"api key {name}: rate_per_s must be > 0, got {rate_per_s}")
        if burst is not None and burst < 1:
            raise ValueError(f"api key {name}: burst must be >= 1, got {burst}")
        return cls(name, _digest(key), rate_per_s, burst)


class TokenBucket:
    """``burst`` tokens, refilled at ``rate_per_s``; starts full."""

    __slots__ = ("_last", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._last = now

    def take(self, now: float) -> float:
        """Take one token: 0.0 when taken, else the seconds until one is there (nothing taken)."""
        self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._last) * self.rate_per_s)
        self._last = max(self._last, now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate_per_s


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` value (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == BEARER and token else None


class KeyTable:
    """The accepted keys and their buckets; ``check`` is safe from any thread."""

    def __init__(self, entries: Sequence[KeyEntry], clock: Callable[[], float] = time.monotonic) -> None:
        if not entries:
            raise ValueError("api_keys: a key table needs at least one key (no keys: leave the doors open)")
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"api_keys: key names must be unique, got {names}")
        self._entries = tuple(entries)
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(AuthOutcome, 0)
        now = clock()
        self._buckets = {
            e.name: TokenBucket(e.rate_per_s, e.burst or max(1, math.ceil(e.rate_per_s)), now)
            for e in entries
            if e.rate_per_s is not None
        }

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def limited_count(self) -> int:
        """How many keys have a quota."""
        return len(self._buckets)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self._entries)

    def identify(self, key: str) -> KeyEntry | None:
        """The entry of ``key``, comparing its digest with every entry's in constant time."""
        presented = _digest(key)
        found: KeyEntry | None = None
        for entry in self._entries:  # no early exit: the time does not say which entry matched
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        return found

    def stats(self) -> AuthStats:
        with self._lock:
            counts = dict(self._counts)
        return AuthStats(**{o.value: counts[o] for o in AuthOutcome})

    def check(self, authorization: str | None) -> AuthResult:
        """Judge one request by its ``Authorization`` value (``Bearer <key>``); takes a quota token if allowed."""
        result = self._judge(authorization)
        with self._lock:
            self._counts[result.outcome] += 1
        return result

    def _judge(self, authorization: str | None) -> AuthResult:
        key = bearer_token(authorization)
        if key is None:
            return AuthResult(AuthOutcome.MISSING)
        entry = self.identify(key)
        if entry is None:
            return AuthResult(AuthOutcome.INVALID)
        bucket = self._buckets.get(entry.name)
        if bucket is None:
            return AuthResult(AuthOutcome.ALLOWED, entry.name)
        with self._lock:
            wait = bucket.take(self._clock())
        if wait > 0:
            return AuthResult(AuthOutcome.RATE_LIMITED, entry.name, wait)
        return AuthResult(AuthOutcome.ALLOWED, entry.name)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
