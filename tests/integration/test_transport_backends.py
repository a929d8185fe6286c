"""Serving over the shared-memory transport (issue #16): the KV crosses through /dev/shm, and the disaggregated
greedy output is still a colocated engine's token for token (the default transport is covered by
test_disaggregation.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import own_cluster
from tests.integration.test_disaggregation import SAMPLING, _assert_same, _disaggregated, _engine_stats

PROMPTS = {f"shm-{i}": tuple(range(40 + 13 * i, 40 + 13 * i + 30 + 37 * i)) for i in range(6)}


@pytest.fixture(scope="module")
def shm_cluster(model_path: str) -> Iterator[Any]:
    with own_cluster(model_path, {"namespace": "tetriserve-test-shm", "transport": {"backend": "shm"}}) as handle:
        yield handle


def test_shm_serving_matches_a_colocated_engine_and_the_kv_went_through_shared_memory(
    shm_cluster: Any, model_path: str
) -> None:
    import ray

    from tetriserve.engine.colocated import ColocatedEngine
    from tetriserve.engine.settings import engine_env

    decode = next(iter(shm_cluster.decode.values()))
    assert ray.get(decode.stats.remote())["transport"].bytes_received == 0
    assert next(iter(shm_cluster.supervision.addresses.values())).startswith("shm://")
    served = _disaggregated(shm_cluster, PROMPTS, SAMPLING, "shm")
    after = _engine_stats(decode)
    assert after["kv"].requests_loaded == len(PROMPTS) and after["transport"].bytes_received > 0
    colocated = (
        ray.remote(ColocatedEngine)
        .options(num_cpus=0, runtime_env={"env_vars": engine_env(shm_cluster.config.engine)})
        .remote(shm_cluster.config.engine, model_path, shm_cluster.config.prefill.chunk_size)
    )
    try:
        _assert_same(served, ray.get(colocated.generate_many.remote(dict(PROMPTS), SAMPLING), timeout=600))
    finally:
        ray.kill(colocated)
