"""What flows back to the front door for a request: token deltas and a final summary."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StreamChunk:
    """New tokens for one request, in order. ``finish_reason`` is set on the last chunk only.

    ``finish_reason`` is one of ``stop``, ``length``, ``abort`` or ``error``; for
    ``error`` the ``error`` field says why. A decode worker that has moved the request
    to another at a slice boundary (SCLS §7) ends its part with an empty chunk whose
    ``moved_to`` names that worker; the GlobalScheduler consumes it.
    """

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    worker: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    moved_to: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class Handoff:
    """Sent by a prefill worker after the first token: the request continues on ``decode_worker``."""

    request_id: str
    decode_worker: str
