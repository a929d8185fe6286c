"""Serving over each non-default transport: the disaggregated greedy output is a colocated engine's,
token for token and top logprob for top logprob, over tcp, ucx and nccl (gloo here) too. The default, shm, is
covered by test_disaggregation.py and every other cluster.

One cluster per backend, one after another (the backend is fixed when a worker opens its endpoint); the
colocated reference is computed once, in the first, and reused. One prompt spans three prefill chunks, so its
KV travels in three parts: over tcp with the baseline predictor, whose estimate is ready before the prefill ends,
the handoff is pipelined (parts sent as they are computed); over nccl the pipeline is off (the parts go as one);
over ucx every load is copied into the decode engine's blocks on its packer thread, off the step, even KV that has
landed before its request is scheduled (``transport.sync_load_mib: 0``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import own_cluster
from tests.integration.test_disaggregation import _engine_stats
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.transport.registry import backend_of

PROMPTS = {f"kv-{i}": tuple(range(40 + 13 * i, 40 + 13 * i + 30 + 37 * i)) for i in range(4)}
PROMPTS["kv-long"] = tuple(range(100, 100 + 700))  # three chunks of the tests' 256
SAMPLING = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
LOGPROB_TOL = 1e-4  # as test_vllm_parity.py: float32 on both sides
Outputs = dict[str, tuple[tuple[int, ...], tuple[Any, ...]]]
_reference: Outputs = {}


@pytest.fixture(scope="module", params=["tcp", "ucx", "nccl"])
def backend_cluster(request: pytest.FixtureRequest, model_path: str) -> Iterator[tuple[str, Any]]:
    kind = str(request.param)
    overrides: dict[str, Any] = {"namespace": f"tetriserve-test-{kind}", "transport": {"backend": kind}}
    if kind == "tcp":
        overrides["prefill.predictor"] = "baseline"  # its estimates are ready at once: pipelined handoffs
    if kind == "nccl":
        overrides["transport"]["pipeline"] = False
    if kind == "ucx":
        overrides["transport"]["sync_load_mib"] = 0  # every load copied in on the packer thread, off the step
    with own_cluster(model_path, overrides) as handle:
        yield kind, handle


def _served(cluster: Any, kind: str) -> Outputs:
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")

    async def one(rid: str, ids: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        tokens: list[int] = []
        logprobs: list[Any] = []
        async for chunk in backend.generate(Request(f"{rid}-{kind}", ids, SAMPLING)):
            assert chunk.finish_reason in (None, "length", "stop"), chunk.error
            tokens.extend(chunk.token_ids)
            logprobs.extend(chunk.logprobs or ())
        return tuple(tokens), tuple(logprobs)

    async def run_all() -> Outputs:
        try:
            results = await asyncio.gather(*(one(rid, ids) for rid, ids in PROMPTS.items()))
        finally:
            backend.close()
        return dict(zip(PROMPTS, results, strict=True))

    return asyncio.run(run_all())


def _colocated(cluster: Any, model_path: str) -> Outputs:
    import ray

    from tetriserve.engine.colocated import ColocatedEngine
    from tetriserve.engine.settings import engine_env

    if not _reference:
        engine = (
            ray.remote(ColocatedEngine)
            .options(num_cpus=0, runtime_env={"env_vars": engine_env(cluster.config.engine)})
            .remote(cluster.config.engine, model_path, cluster.config.prefill.chunk_size)
        )
        try:
            _reference.update(ray.get(engine.generate_with_logprobs.remote(dict(PROMPTS), SAMPLING), timeout=600))
        finally:
            ray.kill(engine)
    return _reference


def test_serving_over_each_backend_matches_a_colocated_engine(
    backend_cluster: tuple[str, Any], model_path: str
) -> None:
    import ray

    kind, cluster = backend_cluster
    decode = next(iter(cluster.decode.values()))
    assert ray.get(decode.stats.remote())["transport"].bytes_received == 0
    assert {backend_of(a) for a in cluster.supervision.addresses.values()} == {kind}
    served = _served(cluster, kind)
    after = _engine_stats(decode)
    assert after["kv"].requests_loaded == len(PROMPTS) and after["transport"].bytes_received > 0
    handoffs = ray.get(next(iter(cluster.prefill.values())).stats.remote())["handoffs"]
    assert sum(handoffs.values()) == len(PROMPTS)
    if kind == "tcp":
        assert handoffs["pipelined"] >= 1, handoffs
    if kind == "nccl":
        assert handoffs["pipelined"] == 0, handoffs
    if kind == "ucx":
        assert after["kv"].requests_loaded_off_step == len(PROMPTS)
    reference = _colocated(cluster, model_path)
    for rid, (tokens, logprobs) in reference.items():
        got_tokens, got_logprobs = served[rid]
        assert got_tokens == tokens, f"{kind} {rid}: {got_tokens} vs colocated {tokens}"
        assert len(got_logprobs) == len(logprobs) == len(tokens)
        for got, want in zip(got_logprobs, logprobs, strict=True):
            assert got.token_ids == want.token_ids, f"{kind} {rid}: top tokens {got.token_ids} vs {want.token_ids}"
            assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOL)
