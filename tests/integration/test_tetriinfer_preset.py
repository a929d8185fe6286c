"""The ``tetriinfer`` preset on real engines (TetriInfer §5's setup): one prefill and one decode worker serve
streams with per-request SLOs, ``status`` and ``/metrics`` name the preset and its mode, every worker runs the
paper's policies (SJF with PrefillSchedBatch 16, ChunkSize 512, power-of-two dispatch; reserve-dynamic checking
the shortest horizon), and every prompt is prefilled on the prefill worker: none is offloaded to the decode
worker, however short."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import in_mode, own_cluster
from tests.integration.policy_view import policy_view
from tests.integration.streams import run_streams
from tetriserve.common.request import SLO, SamplingSpec

NAMESPACE = "tetriserve-test-tetriinfer"
SAMPLING = SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = {f"t-{i}": tuple(range(9 + i, 9 + i + 8 + 60 * i)) for i in range(6)}  # 8 to 308 tokens


@pytest.fixture(scope="module")
def cluster(model_path: str) -> Iterator[Any]:
    with own_cluster(model_path, in_mode("disaggregated", NAMESPACE, {"preset": "tetriinfer"})) as handle:
        yield handle


def test_the_tetriinfer_preset_serves_with_the_paper_s_policies(cluster: Any) -> None:
    import ray

    streams = run_streams(cluster, PROMPTS, SAMPLING, "t", slo=lambda i: SLO(ttft_ms=4000.0 - 400 * i, tbt_ms=800.0))
    assert all(len(tokens) == SAMPLING.max_tokens for tokens in streams.values())
    view = policy_view(cluster)
    view.check_preset("tetriinfer", "disaggregated")
    prefill, decode = view.policies["prefill-0"], view.policies["decode-0"]
    assert {k: prefill[k] for k in ("queue", "sched_batch", "chunking", "chunk_size", "dispatch")} == {
        "queue": "sjf",
        "sched_batch": "16",
        "chunking": "fixed",
        "chunk_size": "512",
        "dispatch": "power-of-two",
    }
    assert prefill["offload_max_tokens"] == "0"
    assert (decode["admission.policy"], decode["admission.horizons"], decode["max_local_prompts"]) == (
        "reserve-dynamic",
        "shortest",
        "0",
    )
    handoffs = ray.get(cluster.prefill["prefill-0"].stats.remote())["handoffs"]
    assert handoffs["offloaded"] == 0 and sum(handoffs.values()) == len(PROMPTS), handoffs
