"""What the front door yields per chunk (``TextDelta``), and vLLM's rules for which of a chunk's tokens are output
text and which stop token ended a request (``core.py`` streams them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tetriserve.common.request import Request
from tetriserve.common.stream import FinishReason, StreamChunk
from tetriserve.frontdoor.detokenizer import IncrementalDetokenizer
from tetriserve.frontdoor.logprobs import LogprobEntry
from tetriserve.frontdoor.stop_strings import StopMatcher


@dataclass(frozen=True)
class TextDelta:
    """New tokens and their text. The last delta has ``finish_reason`` (and ``error`` if it is "error")."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    prompt_tokens: int
    completion_tokens: int  # generated so far, this delta included
    finish_reason: str | None = None
    error: str | None = None
    ttft_ms: float | None = None  # on the first delta that carries tokens
    e2e_ms: float | None = None  # on the last delta
    metrics: Mapping[str, float] = field(default_factory=dict)
    unavailable: bool = False  # an "error" the service owns (no worker could take the request), not the request
    logprobs: tuple[LogprobEntry, ...] | None = None  # one per token of ``token_ids``, when the request asked
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's field)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def take_output(chunk: StreamChunk, detok: IncrementalDetokenizer, stops: StopMatcher) -> tuple[tuple[int, ...], str]:
    """The tokens of a chunk that are output, and their new text (vLLM's rules): all of them, or those up to the
    one that completed a stop string; the token that stopped the engine (EOS, a stop token id) has no text."""
    tokens = chunk.token_ids
    spoken = tokens[:-1] if chunk.finish_reason == FinishReason.STOP else tokens
    if not stops.stops or len(spoken) <= 1:
        return tokens, stops.feed(detok.add(spoken))
    parts = []
    for i, token in enumerate(spoken):
        parts.append(stops.feed(detok.add((token,))))
        if stops.stopped is not None:
            return tokens[: i + 1], "".join(parts)
    return tokens, "".join(parts)


def stop_token(request: Request, tokens: tuple[int, ...], reason: str | None) -> int | None:
    """The stop token id that ended ``request`` (not EOS: vLLM reports None for that)."""
    if reason == "stop" and tokens and tokens[-1] in request.sampling.stop_token_ids:
        return tokens[-1]
    return None
