"""What flows between front doors, the control plane and the workers, as typed messages.

Tokens go straight from the worker that produces them to the front door that
owns the request; the control plane only places requests and keeps a table of
their states from events::

    front door ──place(PlacementRequest)──▶ GlobalScheduler ──Placement──▶ front door
    front door ──submit(Request, subscriber)──▶ prefill worker
    prefill worker ══StreamChunk (first token, then moved_to=decode-j)══▶ front door
    decode worker j ══StreamChunk (every other token, finish)══════════▶ front door
    workers, front door ──StateEvent batches──▶ GlobalScheduler (request table)

Every message that crosses processes through Ray carries ``version``; the token streams' chunks travel in the
channel's frames (``channel/core.py``), which carry its wire version. A chunk says where
its tokens sit in the request's output (``index``), which placement attempt
produced them (``attempt``) and which life of its worker sent it
(``incarnation``), so the front door drops duplicates, stale attempts and
messages of a worker's previous life, and sees gaps. A worker's ``Heartbeat``
on each front door's control stream lists the requests it holds for it, which
keeps every request's inactivity deadline honest (``frontdoor/ray_backend.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import RequestState

PROTOCOL_VERSION = 3


class FinishReason(enum.StrEnum):
    """Why a request's stream ended (compares equal to the OpenAI strings)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"

    @property
    def state(self) -> RequestState:
        return _FINAL[self]


_FINAL = {
    FinishReason.STOP: RequestState.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestState.FINISHED_LENGTH,
    FinishReason.ABORT: RequestState.FINISHED_ABORTED,
    FinishReason.ERROR: RequestState.FINISHED_ERROR,
}


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The log-probabilities at one output position, in vLLM's order: the sampled token first, then the top
    alternatives by rank (the sampled token is listed once even when it is one of them)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def sampled(self) -> float:
        return self.logprobs[0]


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """New tokens of one request, in order. ``finish_reason`` is set on the last chunk only.

    ``index`` is the position of ``token_ids[0]`` in the request's output (the
    number of tokens before it). For ``error`` the ``error`` field says why. A
    worker whose part of the request is over because the request went on
    elsewhere (prefill → decode handoff, SCLS §7 slice move) ends its part with
    a chunk whose ``moved_to`` names that worker. ``logprobs``, when the request
    asked for them, has one entry per token of ``token_ids``.
    """

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None
    prompt_tokens: int = 0
    worker: str = ""
    metrics: Mapping[str, float] | None = None
    moved_to: str | None = None
    index: int = 0
    attempt: int = 0
    incarnation: int = 0
    retry: bool = False
    logprobs: tuple[TokenLogprobs, ...] | None = None
    version: int = PROTOCOL_VERSION

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def end(self) -> int:
        """The index just past this chunk's tokens."""
        return self.index + len(self.token_ids)


def chunk_row(c: StreamChunk) -> list[object]:
    """``c`` as msgpack's plain values (the token streams' codec, ``channel/core.py``)."""
    return [
        c.request_id,
        c.token_ids,
        c.finish_reason,  # a StrEnum: packs as its string
        c.error,
        c.prompt_tokens,
        c.worker,
        dict(c.metrics) if c.metrics else None,
        c.moved_to,
        c.index,
        c.attempt,
        c.incarnation,
        c.retry,
        None if c.logprobs is None else [[p.token_ids, p.logprobs] for p in c.logprobs],
    ]


def chunk_from_row(row: list[Any]) -> StreamChunk:
    """The chunk of a ``chunk_row``; TypeError or ValueError for a row of another shape."""
    rid, tokens, reason, error, prompt_tokens, worker, metrics, moved_to, index, attempt, incarnation, retry, lps = row
    if not isinstance(rid, str) or not isinstance(index, int) or not isinstance(attempt, int):
        raise TypeError("a chunk row's request id is a string, its index and attempt numbers")
    return StreamChunk(
        rid,
        tuple(tokens),
        None if reason is None else FinishReason(reason),
        error,
        prompt_tokens,
        worker,
        metrics,
        moved_to,
        index,
        attempt,
        incarnation,
        retry,
        None if lps is None else tuple(TokenLogprobs(tuple(ids), tuple(lp)) for ids, lp in lps),
    )


@dataclass(frozen=True)
class Heartbeat:
    """A worker's beat on a front door's control stream: who it is now and which of that front door's requests
    (id, attempt) it holds (queued, prefilling, handing off, decoding)."""

    worker: str
    incarnation: int
    holding: tuple[tuple[str, int], ...] = ()
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class PlacementRequest:
    """What the GlobalScheduler needs to place a request: no prompt, no tokens (its prefix only as hashes)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_time: float
    attempt: int = 0
    avoid: tuple[str, ...] = ()  # workers earlier attempts were lost on: other prefill workers first
    trace: str | None = None  # W3C traceparent of the request's span at the front door (``observability/tracing.py``)
    prefix_blocks: tuple[int, ...] = ()  # the prompt's chained block hashes (``common/prefix_blocks.py``)
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class Placement:
    """The GlobalScheduler's decision: which prefill worker takes the request (None: refused, see ``error``;
    ``retry``: none serves right now, ask again; ``retry_after_s``: all are full, the client should come back)."""

    request_id: str
    prefill_worker: str | None
    error: str | None = None
    retry: bool = False
    retry_after_s: int | None = None  # refused because every prefill worker is full: try again after this
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class StateEvent:
    """A request entered ``state`` on ``worker`` at ``at`` (wall clock). Finished states carry the output length;
    a handoff (``DECODE_QUEUED``) or a slice move (``TRANSFERRING``) names the decode worker it goes on on;
    ``estimate``: the request's length estimate as of this event, where the worker has one that is new (the
    handoff's, a late prediction's), for the table's ``Request.length_estimate``."""

    request_id: str
    state: RequestState
    at: float
    worker: str = ""
    detail: str = ""
    output_tokens: int = 0
    moved_to: str | None = None
    attempt: int = 0  # a finish of another attempt than the table's is not the request's outcome
    estimate: LengthEstimate | None = None
    version: int = PROTOCOL_VERSION
