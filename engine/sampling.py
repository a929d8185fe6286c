"""Translate tetriserve's ``SamplingSpec`` into vLLM ``SamplingParams`` (the only place that does)."""

from __future__ import annotations

from typing import Any

from common.request import SamplingSpec


def to_vllm(
    spec: SamplingSpec, *, max_tokens: int, kv_params: dict[str, Any] | None = None, extra: dict[str, Any] | None = None
) -> Any:
    from vllm import SamplingParams

    extra_args: dict[str, Any] = dict(extra or {})
    if kv_params is not None:
        extra_args["kv_transfer_params"] = {"tetriserve": kv_params}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,  # 0 disables top-k in vLLM as in our spec
        seed=spec.seed,
        stop_token_ids=list(spec.stop_token_ids),
        ignore_eos=spec.ignore_eos,
        extra_args=extra_args or None,
    )
