"""Translate tetriserve's ``SamplingSpec`` into vLLM ``SamplingParams``, and vLLM's logprobs back into
``TokenLogprobs`` (the only place that does either).

Engines never detokenize (``detokenize=False``): the front door turns tokens
into text once, and matches stop strings there over the whole output.
``prior_outputs`` is how many of the engine request's prompt tokens were in fact
generated before (on the prefill worker, or on another decode worker before a
slice move): ``min_tokens`` counts them as output here, and so do the presence
and frequency penalties, through ``engine.prior_outputs``. The caller passes
``max_tokens`` already net of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tetriserve.common.engine_tags import EngineTags
from tetriserve.common.request import SamplingSpec
from tetriserve.common.stream import TokenLogprobs
from tetriserve.transport.instructions import KV_PARAMS_KEY, KVInstruction

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.logprobs import Logprob

PRIOR_KEY = "tetriserve_prior_outputs"  # SamplingParams.extra_args: how many prompt tokens are output tokens


def to_vllm(
    spec: SamplingSpec,
    *,
    max_tokens: int,
    prior_outputs: int = 0,
    kv: KVInstruction | None = None,
    tags: EngineTags | None = None,
) -> SamplingParams:
    from vllm import SamplingParams

    extra_args: dict[str, object] = tags.extra() if tags is not None else {}
    if kv is not None:
        extra_args[KV_PARAMS_KEY] = kv.params()
    if prior_outputs > 0 and (spec.presence_penalty or spec.frequency_penalty):
        extra_args[PRIOR_KEY] = prior_outputs
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(max(0, spec.min_tokens - prior_outputs), max_tokens),
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,  # 0 disables top-k in vLLM as in our spec
        min_p=spec.min_p,
        logit_bias=dict(spec.logit_bias) or None,
        allowed_token_ids=list(spec.allowed_token_ids) or None,
        seed=spec.seed,
        stop_token_ids=list(spec.stop_token_ids),
        ignore_eos=spec.ignore_eos,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        repetition_penalty=spec.repetition_penalty,
        logprobs=spec.logprobs,
        detokenize=False,
        extra_args=extra_args or None,
    )


def from_vllm_logprobs(
    positions: Iterable[Mapping[int, Logprob] | None] | None,
) -> tuple[TokenLogprobs, ...] | None:
    """vLLM's per-position ``{token_id: Logprob}`` (sampled token first, then by rank), as plain tuples."""
    if positions is None:
        return None
    return tuple(
        TokenLogprobs(tuple(position), tuple(lp.logprob for lp in position.values()))
        for position in positions
        if position is not None
    )
