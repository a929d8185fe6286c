"""Greedy streams of many prompts at once through a ``RayBackend``, with something done to the cluster midway."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tetriserve.common.request import SLO, Request, SamplingSpec

Progress = dict[str, int]  # prompt -> tokens received so far


def run_streams(
    cluster: Any,
    prompts: dict[str, tuple[int, ...]],
    sampling: SamplingSpec,
    tag: str,
    action: Callable[[Any], Awaitable[Any]] | None = None,
    ready: Callable[[Progress], bool] | None = None,
    finals: dict[str, Mapping[str, float]] | None = None,
    slo: Callable[[int], SLO] | None = None,
    stagger_s: float = 0.0,
) -> dict[str, tuple[int, ...]]:
    """Every prompt at once (request ids ``<prompt>-<tag>``); ``action(admin)`` runs once ``ready(progress)``
    (default: every stream has 8 tokens). Every stream must end with ``length``; returns each one's tokens, and
    puts each one's last chunk's per-request metrics in ``finals``. ``slo(i)``: the i-th prompt's objectives;
    ``stagger_s``: the i-th prompt is sent i × this late (so they arrive in order)."""
    from tetriserve.frontdoor.ray_admin import RayAdmin
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend, admin = RayBackend(cluster, "tiny-llama"), RayAdmin(cluster, "tiny-llama")
    progress: Progress = {}
    is_ready = ready or (lambda p: len(p) == len(prompts) and min(p.values()) >= 8)

    async def one(i: int, rid: str, ids: tuple[int, ...]) -> tuple[int, ...]:
        await asyncio.sleep(stagger_s * i)
        out: list[int] = []
        objectives = slo(i) if slo is not None else SLO()
        async for chunk in backend.generate(Request(f"{rid}-{tag}", ids, sampling, slo=objectives)):
            assert chunk.finish_reason in (None, "length"), chunk.error
            out.extend(chunk.token_ids)
            progress[rid] = len(out)
            if chunk.finish_reason is not None and finals is not None:
                finals[rid] = dict(chunk.metrics or {})
        return tuple(out)

    async def act() -> None:
        if action is None:
            return
        while not is_ready(progress):
            await asyncio.sleep(0.005)
        await action(admin)

    async def run_all() -> dict[str, tuple[int, ...]]:
        try:
            *results, _ = await asyncio.wait_for(
                asyncio.gather(*(one(i, r, p) for i, (r, p) in enumerate(prompts.items())), act()), 300
            )
        finally:
            backend.close()
        return dict(zip(prompts, results, strict=True))

    return asyncio.run(run_all())


def same_tokens(got: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> None:
    bad = [rid for rid in want if got[rid] != want[rid]]
    assert not bad, f"{len(bad)} differ, e.g. {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
