"""Incremental detokenization: token ids in, text deltas out, never half a character.

Byte-level BPE (and SentencePiece byte fallback) can split one character over
several tokens, and decoding a lone token can drop or add a leading space. So
we never decode a token alone: we decode a small sliding window and emit what
it adds over the previous window (the prefix/read-offset scheme of HF TGI and
vLLM)::

    ids:  ... p p p p p | g g g | g g
              ^prefix     ^read   ^end
    prefix_text = decode(ids[prefix:read])      # already emitted
    full_text   = decode(ids[prefix:end])
    if full_text is longer and does not end in U+FFFD (an incomplete UTF-8 sequence):
        emit full_text[len(prefix_text):]; prefix, read = read, end
    else: hold the tokens back until more arrive

The window starts with the last few prompt tokens so the first generated
token decodes with the right spacing. What is still held back when the stream
ends (an incomplete UTF-8 sequence) is dropped, as vLLM's detokenizer (the
``tokenizers`` ``DecodeStream``) drops it: a character cut off by ``max_tokens``
is not text, and sending U+FFFD for it would differ from plain vLLM's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_PROMPT_CONTEXT_TOKENS = 5
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text deltas."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = self._tokenizer.decode(
            list(ids),
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return str(text)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the text that is now complete (possibly empty)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_INCOMPLETE):
            self._prefix, self._read = self._read, len(self._ids)
            return full_text[len(prefix_text) :]
        return ""
