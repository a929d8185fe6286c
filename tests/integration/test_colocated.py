"""The colocated mode on real engines: two workers, each computing prompts and decoding on one engine.

Greedy streams of prompts of several lengths at once: every one ends with its ``max_tokens`` tokens, the same in
every run whatever the batching (float32, greedy); ``status`` names the workers
``colocated`` with both sides' policies; a policy change of either side reaches them; and a colocated worker
killed under streams loses none of them (its requests are placed again on the other with the tokens they have).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.integration.conftest import in_mode, own_cluster
from tests.integration.streams import run_streams, same_tokens
from tetriserve.common.request import SamplingSpec

NAMESPACE = "tetriserve-test-colocated"
SAMPLING = SamplingSpec(max_tokens=40, temperature=0.0, ignore_eos=True)
# prompts of 20 to 300 tokens: the longer ones take several chunks of 128 beside the others' decodes
PROMPTS = {f"c-{i}": tuple(range(5 + 3 * i, 5 + 3 * i + 20 + 56 * i)) for i in range(6)}


@pytest.fixture(scope="module")
def cluster(model_path: str) -> Iterator[Any]:
    overrides = in_mode(
        "colocated",
        NAMESPACE,
        {
            "prefill.chunk_size": 128,
            "prefill.queue_policy": "sjf",
            "decode.admission.policy": "reserve-dynamic",
        },
    )
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _status(cluster: Any) -> Any:
    from tetriserve.frontdoor.ray_admin import RayAdmin

    return asyncio.run(RayAdmin(cluster, "tiny-llama").status())


@pytest.fixture(scope="module")
def undisturbed(cluster: Any) -> dict[str, tuple[int, ...]]:
    return run_streams(cluster, PROMPTS, SAMPLING, "calm")


def test_every_stream_gets_its_tokens_and_status_names_the_colocated_workers(
    cluster: Any, undisturbed: dict[str, tuple[int, ...]]
) -> None:
    assert all(len(tokens) == SAMPLING.max_tokens for tokens in undisturbed.values())
    st = _status(cluster)
    workers = {w.worker_id: w for w in st.workers}
    assert sorted(workers) == ["colocated-0", "colocated-1"]
    for w in workers.values():
        assert (w.role, w.health) == ("colocated", "serving"), w
        policy = dict(w.policy)
        assert (policy["queue"], policy["chunk_size"], policy["admission.policy"]) == ("sjf", "128", "reserve-dynamic")
    finals: dict[str, Mapping[str, float]] = {}
    again = run_streams(cluster, PROMPTS, SAMPLING, "again", finals=finals)
    same_tokens(again, undisturbed)  # greedy: placement and batching do not change a token
    # each request's length estimate reaches its last chunk as per-request metrics
    assert sorted(finals) == sorted(PROMPTS)
    assert all(m["predicted_output_tokens_lower"] <= m["predicted_output_tokens"] for m in finals.values()), finals


def test_a_policy_change_of_either_side_reaches_every_colocated_worker(cluster: Any) -> None:
    from tetriserve.frontdoor.ray_admin import RayAdmin

    admin = RayAdmin(cluster, "tiny-llama")
    try:
        changed = asyncio.run(admin.set_policy(None, {"queue": "fcfs", "admission.policy": "greedy"}))
        assert {w.worker_id for w in changed} == {"colocated-0", "colocated-1"}
        assert all((w.policy["queue"], w.policy["admission.policy"]) == ("fcfs", "greedy") for w in changed)
    finally:
        asyncio.run(admin.set_policy(None, {"queue": "sjf", "admission.policy": "reserve-dynamic"}))


def test_a_colocated_worker_killed_under_streams_loses_nothing(
    cluster: Any, undisturbed: dict[str, tuple[int, ...]]
) -> None:
    import ray

    async def kill(admin: Any) -> None:
        ray.kill(ray.get_actor("colocated-0", namespace=cluster.config.namespace), no_restart=True)

    got = run_streams(cluster, PROMPTS, SAMPLING, "kill", kill)
    same_tokens(got, undisturbed)
    deadline = time.monotonic() + 120
    while True:  # the supervisor brings it back, still colocated
        roles = {w.worker_id: (w.role, w.health) for w in _status(cluster).workers}
        if roles.get("colocated-0") == ("colocated", "serving"):
            break
        assert time.monotonic() < deadline, roles
        time.sleep(0.5)
