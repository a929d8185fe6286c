"""Incremental detokenization: token ids in, text deltas out, never half a character.

Byte-level BPE (and SentencePiece byte fallback) can split one character over
several tokens, and decoding a lone token can drop or add a leading space. So
a token is never decoded alone. Two ways, the same text (on byte garbage that never completes a character the
window may hold back a longer tail, which is then dropped):

- **Rust stream** (fast tokenizers, the usual case): the ``tokenizers``
  library's ``DecodeStream``, primed with the last few prompt tokens, steps one
  token at a time and returns the text it completes (None while a character is
  incomplete). This is what vLLM's own detokenizer uses; per token it costs a
  small fraction of the window below (``python benchmarks/diagnostics/detokenizer_cost.py``), which
  matters because the front door detokenizes every token of every stream.
- **Sliding window** (any other tokenizer, and a stream that fails): decode a
  small window and emit what it adds over the previous one (the prefix/read
  offset scheme of HF TGI and vLLM)::

    ids:  ... p p p p p | g g g | g g
              ^prefix     ^read   ^end
    prefix_text = decode(ids[prefix:read])      # already emitted
    full_text   = decode(ids[prefix:end])
    if full_text is longer and does not end in U+FFFD (an incomplete UTF-8 sequence):
        emit full_text[len(prefix_text):]; prefix, read = read, end
    else: hold the tokens back until more arrive

The window starts with the last few prompt tokens so the first generated token
decodes with the right spacing. What is still held back when the stream ends (an
incomplete UTF-8 sequence) is dropped, as vLLM's detokenizer drops it: a
character cut off by ``max_tokens`` is not text, and sending U+FFFD for it would
differ from plain vLLM's answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_PROMPT_CONTEXT_TOKENS = 5
_INCOMPLETE = "\ufffd"


class _Stream(Protocol):
    """What a ``tokenizers.decoders.DecodeStream`` does here: the text ``token`` completes (None: none yet)."""

    def step(self, tokenizer: Tokenizer, token: int, /) -> str | None: ...


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text deltas."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
        stream: bool = True,
    ) -> None:
        """``stream``: use the Rust ``DecodeStream`` where the tokenizer has one (False: always the window)."""
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)
        self._rust: Tokenizer | None = getattr(tokenizer, "_tokenizer", None)  # a fast tokenizer's, else None
        self._stream: _Stream | None = _decode_stream(self._rust, self._ids, skip_special_tokens) if stream else None

    @property
    def streaming(self) -> bool:
        """Whether this request is detokenized by the Rust stream (else by the window)."""
        return self._stream is not None

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the text that is now complete (possibly empty)."""
        if not token_ids:
            return ""
        if self._stream is not None:
            return self._step(token_ids)
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_INCOMPLETE):
            self._prefix, self._read = self._read, len(self._ids)
            return full_text[len(prefix_text) :]
        return ""

    def _step(self, token_ids: Sequence[int]) -> str:
        parts: list[str] = []
        stream, rust = self._stream, self._rust
        assert stream is not None and rust is not None  # ``add`` steps only while the stream (of ``rust``) lives
        for i, token in enumerate(token_ids):
            try:
                piece = stream.step(rust, token)
            except Exception as exc:  # the stream's state broke (a tokenizer with non-monotonic output)
                logger.warning("detokenizer stream failed (%s); this request goes on with the window", exc)
                self._stream = None
                self._prefix, self._read = max(0, len(self._ids) - _PROMPT_CONTEXT_TOKENS), len(self._ids)
                return "".join(parts) + self.add(token_ids[i:])
            self._ids.append(token)
            if piece:
                parts.append(piece)
        return "".join(parts)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = self._tokenizer.decode(
            list(ids),
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return str(text)


def _decode_stream(rust: Tokenizer | None, context: list[int], skip_special_tokens: bool) -> _Stream | None:
    """A ``DecodeStream`` primed with ``context`` (what it returns for those is not output), or None where the
    tokenizer has no Rust backend or the ``tokenizers`` library no stream."""
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    if not isinstance(rust, Tokenizer):
        return None
    stream = DecodeStream(skip_special_tokens=skip_special_tokens)
    try:
        for token in context:
            stream.step(rust, token)
    except Exception:
        return None
    return stream
