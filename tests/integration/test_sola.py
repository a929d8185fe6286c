"""SOLA's preset on real engines in both modes: the predicted-TTFT order, the problem switch and
the constrained workload (prefill.queue_policy and prefill.chunking ``sola``), the predicted-TPOT admission.

A TBT objective of 1 ms, far below a CPU decode step, keeps p^TPOT above p^TTFT. On colocated engines, the
paper's setting, that makes the engines optimise TPOT (SOLA §4.4.1) and hold prompts back by n_i (eq. 2) while
decodes run. Disaggregated, the prefill worker runs the prompt half and the decode worker the admission by
predicted TPOT. Every stream still ends with its tokens, ``status`` shows the policies and their decision counts,
and ``/metrics`` exports the same counts under ``policy="sola"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import MODES, in_mode, own_cluster
from tests.integration.policy_view import policy_view
from tests.integration.streams import run_streams
from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.common.cost_profile import CostProfile, SweepPoint
from tetriserve.common.request import SLO, SamplingSpec

NAMESPACE = "tetriserve-test-sola"
SAMPLING = SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = {f"s-{i}": tuple(range(7 + i, 7 + i + 16 + 40 * i)) for i in range(6)}  # 16 to 216 tokens


@pytest.fixture(scope="module", params=MODES)
def cluster(request: pytest.FixtureRequest, model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # a cost profile of the tiny model's order of magnitude: 20 µs a prompt token + 2 ms, 2 ms a decode step
    profile = CostProfile(
        "tiny-llama",
        "test",
        PrefillCost(0.0, 0.0, 2e-5, 2e-3),
        DecodeCost(1e-4, 1e-7, 2e-3),
        pivot_tokens=128,
        pivot_seconds=4.6e-3,
        sweep=(SweepPoint(128, 4.6e-3),),
        tile_tokens=32,
    )
    path = profile.save(Path(tmp_path_factory.mktemp("sola")) / "profile.json")
    overrides = in_mode(
        request.param,
        NAMESPACE,
        {
            "preset": "sola",
            "prefill.cost_profile": str(path),
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _streams(cluster: Any) -> dict[str, tuple[int, ...]]:
    """Every prompt at once, each with a TTFT objective of 3 s and a TBT one of 1 ms."""
    return run_streams(cluster, PROMPTS, SAMPLING, "sola", slo=lambda i: SLO(ttft_ms=3000.0, tbt_ms=1.0))


def test_sola_runs_from_the_config_and_counts_its_decisions(cluster: Any) -> None:
    got = _streams(cluster)
    assert all(len(tokens) == SAMPLING.max_tokens for tokens in got.values())
    view = policy_view(cluster)
    view.check_preset("sola", cluster.config.mode)
    for worker, policy in view.policies.items():
        role = view.roles[worker]
        if role != "decode":
            assert (policy["queue"], policy["chunking"]) == ("sola", "sola"), (worker, policy)
            assert policy["sola_tile_tokens"] == "profile"  # the profile's 32
        if role != "prefill":
            assert policy["admission.policy"] == "sola", (worker, policy)
    decided = view.check_decided("sola")
    if cluster.config.mode == "colocated":
        assert decided.get("tpot_iterations", 0) > 0, decided
