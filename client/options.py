"""Keyword options of ``generate()``/``complete()`` and the ``GenerateRequest`` they build
(plus the ``SetPolicyRequest`` of ``set_policy()``).

Shared by the sync and async clients so both accept exactly the same options.
Range checks are the server's job (it knows the model); this module only
checks types so a mistake fails before a network round trip.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TypedDict

from tetriserve.protos import tetriserve_pb2 as pb


class GenerateOptions(TypedDict, total=False):
    """Options of ``generate()`` and ``complete()``; every one is optional.

    Keys:
        max_tokens: most tokens to generate (server default 16, capped to the context left).
        temperature: sampling temperature in [0, 2]; 0 is greedy.
        top_p: nucleus sampling mass in (0, 1].
        top_k: sample among the k most likely tokens; 0 or -1 disables.
        seed: per-request sampling seed.
        stop_token_ids: tokens that end generation (besides EOS).
        stop: strings that end generation (a str or a sequence); the one found is not returned.
        ignore_eos: keep generating past EOS (benchmarks).
        min_tokens: generate at least this many tokens before EOS or a stop token.
        presence_penalty / frequency_penalty: in [-2, 2], for tokens already in the output.
        repetition_penalty: > 0, for tokens in the prompt or output (1 is none).
        logprobs: also return each token's log-probability and the k (0..20) most likely at its position.
        min_p: minimum probability relative to the most likely token, in [0, 1].
        logit_bias: token id -> bias added to its logit (clamped to [-100, 100]).
        allowed_token_ids: only these token ids may be sampled.
        slo_ttft_ms / slo_tbt_ms / slo_jct_ms: latency objectives in milliseconds.
        priority: higher is more important.
        request_id: id for ``abort()``; a random one is generated when absent.
        model: served model name; empty means the one served.
        timeout: seconds for the whole call, retries included (gRPC deadline).
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop_token_ids: Sequence[int]
    stop: str | Sequence[str]
    ignore_eos: bool
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logprobs: int
    min_p: float
    logit_bias: Mapping[int, float]
    allowed_token_ids: Sequence[int]
    slo_ttft_ms: float
    slo_tbt_ms: float
    slo_jct_ms: float
    priority: int
    request_id: str
    model: str
    timeout: float


_KNOWN = frozenset(GenerateOptions.__annotations__)
_SCALARS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "min_p",
)


def new_request_id() -> str:
    return uuid.uuid4().hex


def build_generate_request(prompt: str | Sequence[int], options: GenerateOptions) -> pb.GenerateRequest:
    """The ``GenerateRequest`` for ``prompt`` and ``options`` (``request_id`` must already be set)."""
    unknown = set(options) - _KNOWN
    if unknown:
        raise TypeError(f"unknown generate option(s): {sorted(unknown)}")
    request = pb.GenerateRequest(
        request_id=options["request_id"],
        model=options.get("model", ""),
        priority=int(options.get("priority", 0)),
    )
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        request.token_ids.ids.extend(prompt)
        request.token_ids.SetInParent()  # an empty list is still a (rejected) token prompt, not "no prompt"
    else:
        raise TypeError(f"prompt must be a str or a sequence of int token ids, got {type(prompt).__name__}")
    raw: dict[str, object] = dict(options)
    sampling = request.sampling
    for name in _SCALARS:
        if raw.get(name) is not None:
            setattr(sampling, name, raw[name])
    sampling.stop_token_ids.extend(options.get("stop_token_ids", ()))
    stop = options.get("stop", ())
    sampling.stop.extend([stop] if isinstance(stop, str) else stop)
    sampling.ignore_eos = bool(options.get("ignore_eos", False))
    sampling.logit_bias.update({int(k): float(v) for k, v in options.get("logit_bias", {}).items()})
    sampling.allowed_token_ids.extend(options.get("allowed_token_ids", ()))
    for name in ("ttft_ms", "tbt_ms", "jct_ms"):
        value = raw.get(f"slo_{name}")
        if value is not None:
            setattr(request.slo, name, value)
    return request


def with_request_id(options: GenerateOptions) -> GenerateOptions:
    """``options`` with a ``request_id`` (a fresh one when absent or empty)."""
    if options.get("request_id"):
        return options
    return {**options, "request_id": new_request_id()}


def build_set_policy_request(changes: Mapping[str, str | int], worker_id: str | None) -> pb.SetPolicyRequest:
    """The request of ``set_policy()`` (shared by both clients); values travel as strings."""
    if not isinstance(changes, Mapping):
        raise TypeError(f"changes must be a mapping of policy key to value, got {type(changes).__name__}")
    return pb.SetPolicyRequest(worker_id=worker_id or "", changes={str(k): str(v) for k, v in changes.items()})
