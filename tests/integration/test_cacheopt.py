"""CacheOpt admission on real engines in both modes (CacheOpt §3.3): selected by its preset, it shows in
``status`` with its parameters and the decisions it took, and ``/metrics`` exports them under
``policy="cacheopt"``.

Two engines, one prefill and one decode or two colocated ones, each with a KV cache of 40 blocks (0.005 GiB of the
tiny model's 128 KiB blocks, 1280 tokens), and eight greedy streams of 32 to 88 prompt tokens and 200 output
tokens each (2,000 to 2,300 tokens of KV together), half of them with a TBT SLO of 1 ms, which no step meets:
where they wait for the engine (the decode worker's queue; a colocated worker's, prompts included) they are
critical (§3.3.2), and the waiting queue is put to admission by TBT slack, not arrival.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import MODES, in_mode, own_cluster
from tests.integration.policy_view import policy_view
from tetriserve.common.request import SLO, Request, SamplingSpec

NAMESPACE = "tetriserve-test-cacheopt"
SAMPLING = SamplingSpec(max_tokens=200, temperature=0.0, ignore_eos=True)
PROMPTS = {f"co-{i}": tuple(range(7 + i, 7 + i + 32 + 8 * i)) for i in range(8)}  # 32, 40, ..., 88 tokens
TIGHT_MS, LOOSE_MS = 1.0, 60_000.0


@pytest.fixture(scope="module", params=MODES)
def cluster(request: pytest.FixtureRequest, model_path: str) -> Iterator[Any]:
    overrides = in_mode(
        request.param,
        NAMESPACE,
        {
            "engine.max_model_len": 512,
            "engine.kv_cache_gb": 0.005,
            "preset": "cacheopt",
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _streams(cluster: Any, tag: str) -> dict[str, int]:
    """Every prompt at once, alternately with the tight and the loose TBT SLO; the tokens each one got."""
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")

    async def one(i: int, rid: str, ids: tuple[int, ...]) -> int:
        slo = SLO(tbt_ms=TIGHT_MS if i % 2 == 0 else LOOSE_MS)
        got = 0
        async for chunk in backend.generate(Request(f"{rid}-{tag}", ids, SAMPLING, slo=slo)):
            assert chunk.finish_reason in (None, "length"), chunk.error
            got += len(chunk.token_ids)
        return got

    async def run_all() -> list[int]:
        try:
            jobs = (one(i, rid, ids) for i, (rid, ids) in enumerate(PROMPTS.items()))
            return list(await asyncio.wait_for(asyncio.gather(*jobs), 300))
        finally:
            backend.close()

    return dict(zip(PROMPTS, asyncio.run(run_all()), strict=True))


def test_cacheopt_selected_from_the_config_decides_and_status_shows_it(cluster: Any) -> None:
    # the first round teaches the baseline predictor the outputs' length (it starts from no history); in the
    # second the padded demands, 200 tokens of output each, hold requests back
    for tag in ("learn", "decide"):
        got = _streams(cluster, tag)
        assert got == dict.fromkeys(PROMPTS, SAMPLING.max_tokens)  # every stream ends with all its tokens
    view = policy_view(cluster)
    view.check_preset("cacheopt", cluster.config.mode)
    for worker in view.admitting():
        policy = view.policies[worker]
        assert policy["admission.policy"] == "cacheopt"
        # CacheOpt §5's defaults: 8 reserved blocks, m = 2 iterations, B = 8 tokens
        assert (policy["admission.reserve_blocks"], policy["admission.proactive_iters"]) == ("8", "2")
        assert policy["admission.basic_tokens"] == "8"
    decided = view.check_decided("cacheopt")
    assert set(decided) <= {"slack_order", "critical", "amortised"}, decided
