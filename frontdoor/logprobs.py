"""Log-probabilities at the front door: ids and numbers from the engines, token strings and OpenAI shapes here.

Engines never detokenize, so a ``StreamChunk`` carries only ``TokenLogprobs``
(ids and log-probabilities, the sampled token first, then the top alternatives
by rank: vLLM's order). The front door names the tokens the way vLLM's output
processor does, so answers match a plain vLLM server's:

* a token's string is ``tokenizer.decode([id])``, with the SentencePiece leading
  space put back where ``decode`` drops it (vLLM's ``convert_ids_list_to_tokens``);
* a string ending in U+FFFD (a byte of a character split over tokens) is decoded
  again after up to 4 of the sampled tokens before it, and keeps what that adds
  (vLLM's ``_correct_decoded_token``). The context is the whole output, so a
  character split across the prefill→decode handoff is named right too.

Shapes (vLLM's ``_create_completion_logprobs`` / ``_create_chat_logprobs``):
completions get ``{text_offset, token_logprobs, tokens, top_logprobs}`` with
up to k+1 entries per position keyed by token string; chat gets
``{content: [{token, logprob, bytes, top_logprobs: [...]}]}`` with the first
``top_logprobs`` entries. Log-probabilities are clamped at -9999 (JSON has no -inf).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from tetriserve.common.stream import TokenLogprobs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"
_CONTEXT = 4  # enough sampled tokens before a position to complete any UTF-8 character
_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One output position: the sampled token, its string and log-probability, and ``top``, (id, string,
    logprob) of the sampled token and then the alternatives by rank (``logprob`` is None where the engine sent
    none)."""

    token_id: int
    token: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()


class TokenStrings:
    """Single-token strings of one tokenizer (cached: a vocabulary is finite), as vLLM names them."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._marker = _space_marker(tokenizer)
        self._cache: dict[int, str] = {}

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    def one(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.decode([token_id]) or ""
            if self._marker is not None:
                raw = str(self._tokenizer.convert_ids_to_tokens(token_id) or "")
                missing = (len(raw) - len(raw.lstrip(self._marker))) - (len(text) - len(text.lstrip(" ")))
                text = " " * max(0, missing) + text
            self._cache[token_id] = text
        return text

    def completed(self, token_id: int, context: Sequence[int]) -> str:
        """The string of ``token_id`` ending a character that began in ``context`` ("" if it does not end one)."""
        for n in range(1, min(len(context), _CONTEXT) + 1):
            ctx = list(context[-n:])
            full = self.decode([*ctx, token_id])
            if full.endswith(_INCOMPLETE):
                continue
            clean = len(ctx)  # context tokens that were themselves pieces of this character count as its text
            while clean > 0 and self.one(ctx[clean - 1]).endswith(_INCOMPLETE):
                clean -= 1
            prefix = self.decode(ctx[:clean]) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


class LogprobNamer:
    """One request's positions, named in order (it keeps the sampled tokens as context)."""

    def __init__(self, strings: TokenStrings) -> None:
        self._strings = strings
        self._sampled: list[int] = []

    def name(self, token_ids: Sequence[int], positions: Sequence[TokenLogprobs] | None) -> tuple[LogprobEntry, ...]:
        out = []
        for i, token_id in enumerate(token_ids):
            position = positions[i] if positions is not None and i < len(positions) else None
            context = self._sampled[-_CONTEXT:]
            if position is None:
                out.append(LogprobEntry(token_id, self._named(token_id, context), None))
            else:
                pairs = list(zip(position.token_ids, position.logprobs, strict=True))
                top = tuple((t, self._named(t, context), lp) for t, lp in pairs)
                sampled = dict(pairs).get(token_id, position.sampled)
                out.append(LogprobEntry(token_id, self._named(token_id, context), sampled, top))
            self._sampled.append(token_id)
        return tuple(out)

    def _named(self, token_id: int, context: Sequence[int]) -> str:
        text = self._strings.one(token_id)
        return self._strings.completed(token_id, context) if text.endswith(_INCOMPLETE) else text


class CompletionLogprobs(TypedDict):
    """A completion choice's ``logprobs``: per position its text offset, log-probability, string and top
    alternatives (string to log-probability; None where the engine sent none)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprob(TopLogprob):
    """One position of a chat choice's ``logprobs``: the sampled token and the top alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[ChatLogprob]


def _floor(logprob: float) -> float:
    return max(logprob, _FLOOR)


def completion_logprobs(entries: Sequence[LogprobEntry], top_n: int, text_offset: int) -> CompletionLogprobs:
    """The ``logprobs`` of a completion choice (or of one streamed chunk, from ``text_offset``)."""
    offsets: list[int] = []
    tops: list[dict[str, float] | None] = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry.token)
        tops.append({tok: _floor(lp) for i, (_, tok, lp) in enumerate(entry.top) if i <= top_n} if entry.top else None)
    return {
        "text_offset": offsets,
        "token_logprobs": [None if e.logprob is None else _floor(e.logprob) for e in entries],
        "tokens": [e.token for e in entries],
        "top_logprobs": tops,
    }


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(entries: Sequence[LogprobEntry], top_n: int) -> ChatLogprobs:
    """The ``logprobs`` of a chat choice (or of one streamed chunk)."""
    content: list[ChatLogprob] = []
    for entry in entries:
        item: ChatLogprob = {
            "token": entry.token,
            "logprob": _FLOOR if entry.logprob is None else _floor(entry.logprob),
            "bytes": _bytes(entry.token),
            "top_logprobs": [
                {"token": tok, "logprob": _floor(lp), "bytes": _bytes(tok)} for _, tok, lp in entry.top[:top_n]
            ],
        }
        content.append(item)
    return {"content": content}


def _space_marker(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The Metaspace replacement character (SentencePiece's ``▁``) whose leading instance ``decode`` drops, or
    None for tokenizers whose single tokens decode faithfully (byte-level BPE)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except Exception:
        return None
    for sub in [pre, *pre.get("pretokenizers", [])]:
        if sub.get("type") == "Metaspace":
            return str(sub.get("replacement", "\u2581"))
    return None
