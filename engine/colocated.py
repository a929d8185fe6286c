"""A plain colocated vLLM engine (prefill and decode in one engine): the reference tetriserve is compared with.

Same engine settings as the cluster's engines minus the KV connector, so with
greedy sampling in float32 the disaggregated cluster must produce exactly its
token ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tetriserve.common.config import EngineConfig
from tetriserve.common.request import SamplingSpec
from tetriserve.common.stream import TokenLogprobs
from tetriserve.engine.settings import EngineRole, build_engine_args


class ColocatedEngine:
    def __init__(self, config: EngineConfig, model_path: str, chunk_size: int = 512) -> None:
        from tetriserve.engine.loop import EngineLoop

        self.engine = EngineLoop(
            build_engine_args(config, model_path, EngineRole.COLOCATED, chunk_size=chunk_size), "colocated"
        )

    async def generate(self, request_id: str, prompt: Sequence[int], sampling: SamplingSpec) -> tuple[int, ...]:
        from tetriserve.engine.sampling import to_vllm

        tokens: list[int] = []
        async for delta in self.engine.generate(request_id, prompt, to_vllm(sampling, max_tokens=sampling.max_tokens)):
            tokens.extend(delta.token_ids)
        return tuple(tokens)

    async def generate_many(
        self, prompts: dict[str, Sequence[int]], sampling: SamplingSpec
    ) -> dict[str, tuple[int, ...]]:
        outs = await asyncio.gather(*(self.generate(rid, p, sampling) for rid, p in prompts.items()))
        return dict(zip(prompts, outs, strict=True))

    async def generate_with_logprobs(
        self, prompts: dict[str, Sequence[int]], sampling: SamplingSpec
    ) -> dict[str, tuple[tuple[int, ...], tuple[TokenLogprobs, ...]]]:
        """Like ``generate_many``, with each position's top logprobs (``sampling.logprobs`` of them)."""
        from tetriserve.engine.sampling import to_vllm

        async def one(rid: str, prompt: Sequence[int]) -> tuple[tuple[int, ...], tuple[TokenLogprobs, ...]]:
            tokens: list[int] = []
            logprobs: list[TokenLogprobs] = []
            async for delta in self.engine.generate(rid, prompt, to_vllm(sampling, max_tokens=sampling.max_tokens)):
                tokens.extend(delta.token_ids)
                logprobs.extend(delta.logprobs or ())
            return tuple(tokens), tuple(logprobs)

        outs = await asyncio.gather(*(one(rid, p) for rid, p in prompts.items()))
        return dict(zip(prompts, outs, strict=True))
