"""Range checks of request fields, shared by both gateways: each raises ``InvalidRequestError`` naming the field
(OpenAI's name; the gateway renames it to its own), with vLLM's ranges."""

from __future__ import annotations

import math
from collections.abc import Mapping

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


def top_k_value(top_k: int | None) -> int:
    top_k = 0 if top_k is None or top_k == -1 else top_k
    if top_k < 0:
        raise InvalidRequestError("top_k", f"must be >= 1, or 0/-1 to disable, got {top_k}")
    return top_k


def min_tokens_value(min_tokens: int | None, max_tokens: int) -> int:
    if min_tokens is None:
        return 0
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidRequestError("min_tokens", f"must be in [0, max_tokens={max_tokens}], got {min_tokens}")
    return min_tokens


def logprobs_value(name: str, logprobs: int | None) -> int | None:
    """How many alternatives per position a request wants with its logprobs (None: no logprobs)."""
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(name, f"must be in [0, {MAX_LOGPROBS}], got {logprobs}")
    return logprobs


def slo_value(slo: SLO | Mapping[str, float | None] | None) -> SLO:
    if slo is None or isinstance(slo, SLO):
        return slo or SLO()
    for name, value in slo.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InvalidRequestError(f"slo.{name}", f"must be a positive number of milliseconds, got {value}")
    return SLO(**slo)
