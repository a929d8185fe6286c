"""When the SDK retries a call, and how long it waits (shared by the sync and async clients).

Rule: only ``UNAVAILABLE`` is retried — and, with ``retry_refused``,
``RESOURCE_EXHAUSTED`` refusals of the admission gate (those that carry a
``retry-after``; a request over the size limit is never retried), waiting at least
what the server asked — and a ``Generate`` stream only until its first response
arrived: after that the request is live in the cluster and a retry could
generate twice. Attempts back off exponentially with jitter and
never outlive the call's overall deadline::

    attempt 1 ──UNAVAILABLE──▶ sleep b ──▶ attempt 2 ──UNAVAILABLE──▶ sleep b·m ──▶ ... ──▶ give up
                                                         (b·m^k capped at max_backoff_s)
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import grpc

from tetriserve.client.errors import retry_after_s


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for ``UNAVAILABLE``.

    Attributes:
        max_attempts: total attempts per call, the first included (1 disables retries).
        initial_backoff_s: wait before the second attempt.
        max_backoff_s: cap on any single wait.
        backoff_multiplier: growth of the wait per attempt.
        jitter: each wait is scaled by a random factor in ``[1 - jitter, 1 + jitter]``.
        retry_refused: also retry calls the service refused for now (``RESOURCE_EXHAUSTED`` with a
            ``retry-after``), waiting at least that long (off by default: a refusal means the service is full,
            and many clients retrying at once keep it full).
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.2
    retry_refused: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"RetryPolicy backoffs must be >= 0, got initial_backoff_s={self.initial_backoff_s} "
                f"max_backoff_s={self.max_backoff_s}"
            )
        if self.backoff_multiplier < 1:
            raise ValueError(f"RetryPolicy.backoff_multiplier must be >= 1, got {self.backoff_multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"RetryPolicy.jitter must be in [0, 1), got {self.jitter}")

    def backoff_s(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` (>= 1) failures."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.backoff_multiplier ** (failed_attempts - 1))
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class Deadline:
    """An absolute deadline on the monotonic clock; ``None`` means no deadline."""

    at: float | None

    @classmethod
    def after(cls, timeout_s: float | None) -> Deadline:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds when set, got {timeout_s}")
        return cls(None if timeout_s is None else time.monotonic() + timeout_s)

    def remaining(self) -> float | None:
        """Seconds left (never below a millisecond, so gRPC reports DEADLINE_EXCEEDED itself)."""
        if self.at is None:
            return None
        return max(self.at - time.monotonic(), 1e-3)


def retry_delay(
    policy: RetryPolicy,
    err: grpc.RpcError,
    failed_attempts: int,
    deadline: Deadline,
    got_response: bool,
) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` to give up and raise ``err``."""
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else None
    if got_response or failed_attempts >= policy.max_attempts:
        return None
    delay = policy.backoff_s(failed_attempts)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and policy.retry_refused:
        retry_after = retry_after_s(err)
        if retry_after is None:  # over the size limit: the same call fails again
            return None
        delay = max(delay, retry_after)
    elif code != grpc.StatusCode.UNAVAILABLE:
        return None
    if deadline.at is not None and time.monotonic() + delay >= deadline.at:
        return None
    return delay
