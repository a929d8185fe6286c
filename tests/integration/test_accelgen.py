"""AccelGen's preset on real engines, in both modes: the prompt side's remaining-time order with dynamic
chunking and multi-resource selection (AccelGen §4.2–§4.4), the decode side's TBT-slack order (§4.3). Colocated,
every worker runs both sides, as the paper's one engine does; disaggregated, the prefill worker runs the prompt side
and the decode worker the decode side.

Prompts sent at once whose SLOs tighten as they arrive: every stream ends with its ``max_tokens`` tokens,
``status`` names the accelgen policies on every worker, and the orders counted a decision that differs from
arrival order (``decided.accelgen.reordered``), which ``/metrics`` exports under ``policy="accelgen"``. The cost
profile is a synthetic one written here (S_pf 128 tokens, T̄_pf 20 ms): the policies read only its numbers.
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
from tetriserve.common.cost_profile import CostProfile
from tetriserve.common.request import SLO, SamplingSpec

NAMESPACE = "tetriserve-test-accelgen"
SAMPLING = SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True)
# eight prompts of 40 to 250 tokens; the later a prompt is sent, the tighter its SLOs
PROMPTS = {f"a-{i}": tuple(range(7 + 5 * i, 7 + 5 * i + 40 + 30 * i)) for i in range(8)}


def _slo(i: int) -> SLO:
    return SLO(ttft_ms=2000.0 - 200 * i, tbt_ms=1000.0 - 100 * i)


@pytest.fixture(scope="module", params=MODES)
def cluster(request: pytest.FixtureRequest, model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = CostProfile(
        model="tiny-llama",
        hardware="test",
        prefill=PrefillCost(0.0, 0.0, 1.5e-4, 1e-3),
        decode=DecodeCost(0.0, 0.0, 1e-3),
        pivot_tokens=128,
        pivot_seconds=0.02,
    )
    path = profile.save(Path(tmp_path_factory.mktemp("profile")) / "tiny.json")
    overrides = in_mode(
        request.param,
        NAMESPACE,
        {
            "preset": "accelgen",
            "prefill.cost_profile": str(path),
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _run(cluster: Any) -> dict[str, tuple[int, ...]]:
    # sent in order, so arrival order is the order of loosening SLOs reversed
    return run_streams(cluster, PROMPTS, SAMPLING, "accelgen", slo=_slo, stagger_s=0.005)


PROMPT_SIDE = {"queue": "accelgen", "chunking": "dynamic", "selection": "multi-resource"}
DECODE_SIDE = {"admission.policy": "accelgen", "preemption.order": "accelgen"}


def test_accelgen_from_config_serves_every_stream_and_counts_its_decisions(cluster: Any) -> None:
    streams = _run(cluster)
    assert all(len(tokens) == SAMPLING.max_tokens for tokens in streams.values())
    view = policy_view(cluster)
    view.check_preset("accelgen", cluster.config.mode)
    colocated = cluster.config.mode == "colocated"
    assert sorted(view.policies) == (["colocated-0", "colocated-1"] if colocated else ["decode-0", "prefill-0"])
    for worker, policy in view.policies.items():
        role = view.roles[worker]
        want = {**(PROMPT_SIDE if role != "decode" else {}), **(DECODE_SIDE if role != "prefill" else {})}
        assert {key: policy.get(key) for key in want} == want, (worker, policy)
    assert view.check_decided("accelgen").get("reordered", 0) > 0
