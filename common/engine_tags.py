"""What a worker hands its engine's scheduler subclass with each request (``SamplingParams.extra_args``).

Engines run in the worker's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
so the frozen ``EngineTags`` object travels as it is, under ``TAGS_KEY``: the
schedulers read typed fields instead of parsing a dict on every step.

    prefill worker  EngineTags(id, arrival, priority, batch_seq, ttft_slo_s, jct_slo_s, estimate, max_tokens)
                    (the length estimate and the client's max_tokens: AccelGen §4.3's S_g, since the prefill
                    engine runs each request to its first token only)
    decode worker   EngineTags(id, tbt_slo_s, estimate counted from the request's first decode token)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tetriserve.common.length import LengthEstimate

TAGS_KEY = "tetriserve"
TAGS_VERSION = 1


@dataclass(frozen=True)
class EngineTags:
    request_id: str | None = None  # the worker's id for it (vLLM suffixes its own request ids)
    arrival: float | None = None
    priority: int = 0
    batch_seq: int = 0  # the PrefillSchedBatch that released it (TetriInfer §3.3.1)
    ttft_slo_s: float | None = None
    jct_slo_s: float | None = None
    tbt_slo_s: float | None = None
    estimate: LengthEstimate | None = None  # predicted output length
    max_tokens: int | None = None  # the client's output cap, where the engine runs the request for fewer
    version: int = TAGS_VERSION

    def extra(self) -> dict[str, object]:
        """The ``extra_args`` entry that carries these tags."""
        return {TAGS_KEY: self}


NO_TAGS = EngineTags()


def tags_of(extra_args: Mapping[str, object] | None) -> EngineTags:
    """The tags in ``extra_args`` (``NO_TAGS`` when there are none, e.g. a plain vLLM request)."""
    tags = (extra_args or {}).get(TAGS_KEY)
    return tags if isinstance(tags, EngineTags) else NO_TAGS
