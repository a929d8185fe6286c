"""Serving over the TCP transport (issue #16): the disaggregated greedy output is a colocated engine's token for
token over this backend too (the default, shm, is covered by test_disaggregation.py and every other cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import own_cluster
from tests.integration.test_disaggregation import SAMPLING, _assert_same, _disaggregated, _engine_stats

PROMPTS = {f"tcp-{i}": tuple(range(40 + 13 * i, 40 + 13 * i + 30 + 37 * i)) for i in range(6)}


@pytest.fixture(scope="module")
def tcp_cluster(model_path: str) -> Iterator[Any]:
    with own_cluster(model_path, {"namespace": "tetriserve-test-tcp", "transport": {"backend": "tcp"}}) as handle:
        yield handle


def test_tcp_serving_matches_a_colocated_engine(tcp_cluster: Any, model_path: str) -> None:
    import ray

    from tetriserve.engine.colocated import ColocatedEngine
    from tetriserve.engine.settings import engine_env

    decode = next(iter(tcp_cluster.decode.values()))
    assert ray.get(decode.stats.remote())["transport"].bytes_received == 0
    assert not next(iter(tcp_cluster.supervision.addresses.values())).startswith("shm://")
    served = _disaggregated(tcp_cluster, PROMPTS, SAMPLING, "tcp")
    after = _engine_stats(decode)
    assert after["kv"].requests_loaded == len(PROMPTS) and after["transport"].bytes_received > 0
    colocated = (
        ray.remote(ColocatedEngine)
        .options(num_cpus=0, runtime_env={"env_vars": engine_env(tcp_cluster.config.engine)})
        .remote(tcp_cluster.config.engine, model_path, tcp_cluster.config.prefill.chunk_size)
    )
    try:
        _assert_same(served, ray.get(colocated.generate_many.remote(dict(PROMPTS), SAMPLING), timeout=600))
    finally:
        ray.kill(colocated)
