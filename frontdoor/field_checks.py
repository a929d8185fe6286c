"""Range checks of request fields, shared by both gateways: each raises ``InvalidRequestError`` naming the field
(OpenAI's name; the gateway renames it to its own), with vLLM's ranges."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from tetriserve.common.errors import InvalidRequestError
from tetriserve.common.request import MAX_LOGPROBS, SLO


def in_range(
    name: str, value: float | None, default: float, low: float, high: float, *, low_open: bool = False
) -> float:
    """``value`` (``default`` when None), checked to lie in [low, high] ((low, high] with ``low_open``)."""
    if value is None:
        return default
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        upper = "" if math.isinf(high) else f", {high:g}]"
        raise InvalidRequestError(name, f"must be in {bracket}{low:g}{upper or ', ∞)'}, got {value}")
    return float(value)


SEED_RANGE = (-(2**63), 2**63 - 1)  # vLLM's: a 64-bit integer
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # the gRPC API's int32
HEAD_MARGIN_TOKENS = 64  # ``check_head``: a head this far past the context is past it whatever follows


def int_value(name: str, value: int | None, low: int, high: int) -> int | None:
    """``value`` checked to lie in [low, high] (None passes): an integer the engines and the wire can carry."""
    if value is not None and not low <= value <= high:
        raise InvalidRequestError(name, f"must be an integer in [{low}, {high}], got {value}")
    return value


def unicode_text(name: str, text: str) -> str:
    """``text`` checked to be valid Unicode: JSON can carry a lone surrogate (``"\\ud800"``), which no UTF-8
    tokenizer or wire encoding takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            name, f"is not valid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None
    return text


def check_head(
    name: str, text: str, encode: Callable[..., list[int]], max_model_len: int, max_token_chars: int
) -> None:
    """Refuse a text far longer than the context from its head alone: tokenizing a body of tens of megabytes
    would hold a tokenizer thread and a core for tens of seconds. Only a text longer than the context's tokens
    at the vocabulary's longest (``max_token_chars``) can be; its head that long is tokenized, and if that alone
    passes the context by ``HEAD_MARGIN_TOKENS`` the whole does too (the margin covers a token cut at the
    head's end). Otherwise (a tokenizer that folds long runs into one token) the caller tokenizes it all."""
    head = (max_model_len + HEAD_MARGIN_TOKENS) * max_token_chars
    if len(text) <= head:
        return
    tokens = len(encode(text[:head], add_special_tokens=False))
    if tokens >= max_model_len + HEAD_MARGIN_TOKENS:
        raise InvalidRequestError(
            name,
            f"is far longer than the context: its first {head} of {len(text)} characters alone are {tokens} "
            f"tokens (max_model_len is {max_model_len})",
        )


def top_k_value(top_k: int | None, vocab_size: int) -> int:
    """0 for no top-k (None, 0, -1, or a k that keeps the whole vocabulary, however large)."""
    top_k = 0 if top_k is None or top_k == -1 else top_k
    if top_k < 0:
        raise InvalidRequestError("top_k", f"must be >= 1, or 0/-1 to disable, got {top_k}")
    return 0 if top_k >= vocab_size else top_k


def min_tokens_value(min_tokens: int | None, max_tokens: int) -> int:
    if min_tokens is None:
        return 0
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidRequestError("min_tokens", f"must be in [0, max_tokens={max_tokens}], got {min_tokens}")
    return min_tokens


def logprobs_value(logprobs: int | None) -> int | None:
    """How many alternatives per position a request wants with its logprobs (None: no logprobs)."""
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {logprobs}")
    return logprobs


def slo_value(slo: SLO | Mapping[str, float | None] | None) -> SLO:
    if slo is None or isinstance(slo, SLO):
        return slo or SLO()
    for name, value in slo.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InvalidRequestError(f"slo.{name}", f"must be a positive number of milliseconds, got {value}")
    return SLO(**slo)


def check_ids(name: str, ids: Sequence[int], vocab_size: int) -> None:
    """Every id of ``ids`` lies in the vocabulary."""
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):
        return
    for pos, tok in enumerate(ids):
        if not 0 <= tok < vocab_size:
            raise InvalidRequestError(
                name, f"token id {tok} at position {pos} is outside the vocabulary [0, {vocab_size})"
            )


def max_tokens_value(
    prompt: Sequence[int], max_tokens: int | None, default: int | None, max_model_len: int, vocab_size: int
) -> int:
    """The output limit: ``max_tokens`` (None: ``default`` capped to the context left, or all of it), checked
    against the context the prompt leaves."""
    if not prompt:
        raise InvalidRequestError("prompt", "must not be empty")
    check_ids("prompt", prompt, vocab_size)
    room = max_model_len - len(prompt)
    if room <= 0:
        raise InvalidRequestError(
            "prompt", f"has {len(prompt)} tokens, which leaves no room to generate (max_model_len is {max_model_len})"
        )
    if max_tokens is None:
        return room if default is None else min(default, room)
    if max_tokens <= 0:
        raise InvalidRequestError("max_tokens", f"must be >= 1, got {max_tokens}")
    if max_tokens > room:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
            f"({max_model_len}); at most {room} tokens can be generated",
        )
    return max_tokens


def logit_bias_value(
    bias: Mapping[str, float] | Mapping[int, float] | None, vocab_size: int
) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (token id, as a string or int → bias) as (id, bias) pairs, each bias clamped to
    [-100, 100] as vLLM does."""
    if not bias:
        return ()
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        if not 0 <= token < vocab_size:
            raise InvalidRequestError("logit_bias", f"token id {token} is outside the vocabulary [0, {vocab_size})")
        if not math.isfinite(value):
            raise InvalidRequestError("logit_bias", f"the bias of token {token} must be a number, got {value}")
        out.append((token, min(100.0, max(-100.0, float(value)))))
    return tuple(out)


def allowed_ids_value(ids: Sequence[int] | None, vocab_size: int) -> tuple[int, ...]:
    """vLLM's ``allowed_token_ids``: when given, at least one, each in the vocabulary."""
    if ids is None:
        return ()
    if not ids:
        raise InvalidRequestError("allowed_token_ids", "must hold at least one token id when given")
    check_ids("allowed_token_ids", ids, vocab_size)
    return tuple(ids)
