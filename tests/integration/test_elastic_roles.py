"""Flips and scaling on real engines while greedy streams run: nothing is lost or changed.

One cluster of 1 prefill + 2 decode workers; the SCLS slice-move tests (``slice_moves.py``) run on it first, while
both decode workers are as started. Then, under streams: `flip decode-1 prefill`, then
`scale --prefill 2 --decode 2` (a new decode worker), then `scale --decode 1` (one drained and removed);
every stream ends with the very tokens of an undisturbed run, `status` shows the roles, counts and flip
count, and new requests are served. Then the ``tetriinfer`` policy flips an idle worker by itself when
the load turns prefill-only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tests.integration.conftest import own_cluster
from tests.integration.slice_moves import (  # collected here, so first: before any flip
    SLICE,
    test_a_destination_that_cannot_take_the_request_leaves_it_where_it_was,  # noqa: F401
    test_moved_requests_keep_their_tokens_and_their_kv_is_shipped_not_recomputed,  # noqa: F401
)
from tests.integration.streams import run_streams, same_tokens
from tetriserve.common.request import Request, SamplingSpec

NAMESPACE = "tetriserve-test-elastic"
SAMPLING = SamplingSpec(max_tokens=48, temperature=0.0, ignore_eos=True)
PROMPTS = {f"e-{i}": tuple(range(12 + 7 * i, 12 + 7 * i + 20 + 11 * i)) for i in range(6)}


@pytest.fixture(scope="module")
def cluster(model_path: str) -> Iterator[Any]:
    overrides = {
        "namespace": NAMESPACE,
        "num_prefill": 1,
        "num_decode": 2,
        "prefill.predictor": "baseline",
        "prefill.dispatch_policy": "round-robin",
        "flip.drain_timeout_s": 120,
        "decode.slice_iters": SLICE,  # the slice moves'; no request moves without an order, and they give them
        "decode.slice_min_interval_s": 3600.0,
        "decode.slice_min_interval_iters": 0,  # Γ in seconds, the hour above, whatever the step time
    }
    with own_cluster(model_path, overrides) as handle:
        yield handle


def _run(cluster: Any, tag: str, action: Callable[[Any], Awaitable[Any]] | None = None) -> dict[str, tuple[int, ...]]:
    """Every prompt at once; ``action(admin)`` once every stream has 8 tokens."""
    return run_streams(cluster, PROMPTS, SAMPLING, tag, action)


def _status(cluster: Any) -> Any:
    from tetriserve.frontdoor.ray_admin import RayAdmin

    return asyncio.run(RayAdmin(cluster, "tiny-llama").status())


def _until(cluster: Any, done: Callable[[Any], bool], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        st = _status(cluster)
        if done(st):
            return st
        assert time.monotonic() < deadline, f"not {what} within {seconds:.0f} s: {st.workers}"
        time.sleep(0.5)


def _serving(st: Any) -> dict[str, str]:
    return {w.worker_id: w.role for w in st.workers if w.health == "serving" and w.lifecycle == "active"}


@pytest.fixture(scope="module")
def undisturbed(cluster: Any) -> dict[str, tuple[int, ...]]:
    return _run(cluster, "ref")


def test_a_decode_worker_flipped_to_prefill_under_streams_loses_nothing(cluster: Any, undisturbed: Any) -> None:
    said: list[str] = []

    async def flip(admin: Any) -> None:
        said.append(await admin.flip("decode-1", "prefill"))

    same_tokens(_run(cluster, "flip", flip), undisturbed)
    assert said == ["draining decode-1 to flip it to prefill"]
    st = _until(cluster, lambda st: _serving(st).get("decode-1") == "prefill", 180, "serving as prefill")
    flipped = next(w for w in st.workers if w.worker_id == "decode-1")
    assert flipped.flips == 1 and flipped.incarnation == 0 and flipped.restarts == 0  # same life, same engine
    assert _serving(st) == {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "prefill"}
    assert {w.transport for w in st.workers} == {"shm"}  # status names each worker's KV transport (the default)
    same_tokens(_run(cluster, "after-flip"), undisturbed)  # both prefill workers serve now
    decisions = [d.order for d in cluster.supervision.elastic.decisions]
    assert decisions == ["flip decode-1 prefill"] * 3


def test_scale_out_then_in_under_streams_loses_nothing(cluster: Any, undisturbed: Any) -> None:
    _until(cluster, lambda st: len(_serving(st)) == 3, 180, "three workers serving")
    said: list[list[str]] = []

    async def scale_out(admin: Any) -> None:
        said.append(await admin.scale(2, 2))

    same_tokens(_run(cluster, "out", scale_out), undisturbed)
    assert said == [["adding decode-2"]]
    st = _until(cluster, lambda st: list(_serving(st).values()).count("decode") == 2, 180, "two decode workers")
    assert sorted(_serving(st)) == ["decode-0", "decode-1", "decode-2", "prefill-0"]
    same_tokens(_run(cluster, "scaled"), undisturbed)

    async def scale_in(admin: Any) -> None:
        said.append(await admin.scale(None, 1))

    same_tokens(_run(cluster, "in", scale_in), undisturbed)
    assert said[-1][0].startswith("draining decode-")
    st = _until(cluster, lambda st: len(st.workers) == 3, 180, "the drained worker removed")
    assert list(_serving(st).values()).count("decode") == 1
    assert len(cluster.decode) == 1 and len(cluster.prefill) == 2


def test_the_tetriinfer_policy_flips_an_idle_worker_when_the_load_turns_prefill_only(cluster: Any) -> None:
    from tetriserve.common.flip_config import FlipConfig
    from tetriserve.control_plane.flip import policy_from_config
    from tetriserve.frontdoor.ray_backend import RayBackend

    _until(cluster, lambda st: len(_serving(st)) == 3, 180, "three workers serving")
    before = {w.worker_id: w.role for w in _status(cluster).workers}
    idle_decode_free = [w for w, role in before.items() if role == "prefill"]
    assert len(idle_decode_free) == 2  # 2 prefill + 1 decode: the policy may only flip a prefill worker ...
    cfg = FlipConfig(policy="tetriinfer", interval_s=4, load_window_s=1, check_interval_s=0.25)
    cluster.supervision.elastic.use(policy_from_config(cfg))
    # ... and one does once the load is decode-heavy: long outputs, prompts rare, so a prefill worker idles
    backend = RayBackend(cluster, "tiny-llama")
    long = SamplingSpec(max_tokens=900, temperature=0.0, ignore_eos=True)

    async def decode_heavy() -> None:
        async def one(i: int) -> None:
            async for chunk in backend.generate(Request(f"dh-{i}", tuple(range(5, 15)), long)):
                assert chunk.finish_reason in (None, "length"), chunk.error

        try:
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(4))), 300)
        finally:
            backend.close()

    t0 = time.monotonic()
    asyncio.run(decode_heavy())
    st = _until(cluster, lambda st: list(_serving(st).values()).count("decode") == 2, 180, "a flip to decode")
    by_policy = [d for d in cluster.supervision.elastic.decisions if d.source == "policy:tetriinfer"]
    assert by_policy and "load under 10%" in by_policy[0].reason, list(cluster.supervision.elastic.decisions)
    assert time.monotonic() - t0 < 300
    assert list(_serving(st).values()).count("prefill") == 1
