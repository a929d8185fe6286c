"""SCLS's batching (§4.4, Algorithm 1) from its preset, on real engines in both modes, with per-request SLOs.

A burst of prompts of very different lengths reaches a waiting queue together: each colocated worker's, whose
queue holds the prompts to compute; or, disaggregated, the decode worker's, given a KV cache too small for the
burst (40 blocks, 1,280 tokens, for about 2,500 tokens of prompts and outputs of 96 tokens), so that handed-off
requests wait there together instead of starting one by one as their KV lands. With a cost profile whose serving-time
estimator makes padding dear (eq. 3 and eq. 4 with large per-token terms), the batching splits them by length,
admits the batch with the longest estimated serving time first and holds the rest a step: ``status`` names the
policy with the paper's slice length and counts its decisions, and ``/metrics`` exports them under
``policy="scls"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import MODES, in_mode, own_cluster
from tests.integration.policy_view import policy_view
from tests.integration.streams import run_streams
from tetriserve.common.request import SLO, SamplingSpec

NAMESPACE = "tetriserve-test-scls"
SAMPLING = SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)
# disaggregated: outputs long enough that requests still decode when the next ones' KV lands
LINGERING = SamplingSpec(max_tokens=96, temperature=0.0, ignore_eos=True)
# 8 prompts of 20 to 412 tokens, the longest last
PROMPTS = {f"s-{i}": tuple(range(7 + i, 7 + i + 20 + 56 * i)) for i in range(8)}
# a padded token costs p1 + S·d1 = 1e-3 + 128·1e-4 = 0.0138 s and a batch p4 + S·d4 = 0.1 + 128·1e-3 = 0.228 s,
# so prompts 56 tokens apart are cheaper in batches of their own
SERVING = {"p1": 1e-3, "p2": 0.0, "p3": 0.0, "p4": 0.1, "d1": 1e-4, "d2": 0.0, "d3": 0.0, "d4": 1e-3}


@pytest.fixture(scope="module", params=MODES)
def cluster(request: pytest.FixtureRequest, model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = tmp_path_factory.mktemp("scls") / "profile.json"
    sola = {"prefill": {"a0": 0.0, "b0": 0.0, "c0": 1e-5, "d0": 1e-3}, "decode": {"a1": 0.0, "b1": 0.0, "c1": 1e-3}}
    scls = {"serving": SERVING, "kv_bytes_per_token": 2048.0, "kv_pool_bytes": 2048.0 * 16384}
    body = {"model": "tiny-llama", "hardware": "test", **sola, "pivot_tokens": 128, "pivot_seconds": 0.01}
    profile.write_text(json.dumps({**body, "scls": scls}))
    short_kv = {"engine.max_model_len": 512, "engine.kv_cache_gb": 0.005} if request.param == "disaggregated" else {}
    overrides = in_mode(
        request.param,
        NAMESPACE,
        {
            **short_kv,
            "preset": "scls",
            "prefill.chunk_size": 128,
            "decode.admission.cost_profile": str(profile),
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def test_status_names_scls_and_counts_its_decisions(cluster: Any) -> None:
    sampling = SAMPLING if cluster.config.mode == "colocated" else LINGERING
    streams = run_streams(cluster, PROMPTS, sampling, "burst", slo=lambda i: SLO(ttft_ms=5000.0, tbt_ms=500.0))
    assert all(len(tokens) == sampling.max_tokens for tokens in streams.values())
    view = policy_view(cluster)
    view.check_preset("scls", cluster.config.mode)
    for worker in view.admitting():
        policy = view.policies[worker]
        assert policy["admission.policy"] == "scls" and policy["admission.zeta"] == "0.9"
        assert policy["slice_iters"] == "128"  # SCLS §5.1's S, by default under scls
    view.check_decided("scls")
