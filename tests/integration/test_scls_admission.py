"""SCLS's batching (§4.4, Algorithm 1) selected from the config, on real colocated engines.

A burst of prompts of very different lengths reaches each colocated worker's waiting queue together. With a
cost profile whose serving-time estimator makes padding dear (eq. 3 and eq. 4 with large per-token terms), the
batching splits them by length, admits the batch with the longest estimated serving time first and holds the
rest a step: ``status`` names the policy with the paper's slice length, and counts its decisions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import colocated, own_cluster
from tests.integration.streams import run_streams
from tetriserve.common.request import SamplingSpec

NAMESPACE = "tetriserve-test-scls"
SAMPLING = SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)
# 8 prompts of 20 to 412 tokens, the longest last
PROMPTS = {f"s-{i}": tuple(range(7 + i, 7 + i + 20 + 56 * i)) for i in range(8)}
# a padded token costs p1 + S·d1 = 1e-3 + 128·1e-4 = 0.0138 s and a batch p4 + S·d4 = 0.1 + 128·1e-3 = 0.228 s,
# so prompts 56 tokens apart are cheaper in batches of their own
SERVING = {"p1": 1e-3, "p2": 0.0, "p3": 0.0, "p4": 0.1, "d1": 1e-4, "d2": 0.0, "d3": 0.0, "d4": 1e-3}


@pytest.fixture(scope="module")
def cluster(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = tmp_path_factory.mktemp("scls") / "profile.json"
    sola = {"prefill": {"a0": 0.0, "b0": 0.0, "c0": 1e-5, "d0": 1e-3}, "decode": {"a1": 0.0, "b1": 0.0, "c1": 1e-3}}
    scls = {"serving": SERVING, "kv_bytes_per_token": 2048.0, "kv_pool_bytes": 2048.0 * 16384}
    body = {"model": "tiny-llama", "hardware": "test", **sola, "pivot_tokens": 128, "pivot_seconds": 0.01}
    profile.write_text(json.dumps({**body, "scls": scls}))
    overrides = colocated(
        NAMESPACE,
        {
            "prefill.chunk_size": 128,
            "decode.admission.policy": "scls",
            "decode.admission.cost_profile": str(profile),
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _status(cluster: Any) -> Any:
    from tetriserve.frontdoor.ray_admin import RayAdmin

    return asyncio.run(RayAdmin(cluster, "tiny-llama").status())


def test_status_names_scls_and_counts_its_decisions(cluster: Any) -> None:
    streams = run_streams(cluster, PROMPTS, SAMPLING, "burst")
    assert all(len(tokens) == SAMPLING.max_tokens for tokens in streams.values())
    workers = {w.worker_id: dict(w.policy) for w in _status(cluster).workers}
    assert sorted(workers) == ["colocated-0", "colocated-1"]
    for policy in workers.values():
        assert policy["admission.policy"] == "scls" and policy["admission.zeta"] == "0.9"
        assert policy["slice_iters"] == "128"  # SCLS §5.1's S, by default under scls
    decided = {k: int(v) for policy in workers.values() for k, v in policy.items() if k.startswith("decided.scls.")}
    assert sum(decided.values()) > 0, workers
