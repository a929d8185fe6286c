"""Worker failures on real engines (2 prefill + 2 decode): nothing is lost, everything comes back.

Each test kills one actor (a decode worker, a prefill worker, the GlobalScheduler,
the monitor) with ``ray.kill``, or a decode worker's process with SIGKILL, while
greedy streams run (a prefill worker also once with every request it holds between
its first token and its handoff), then checks what a client
would: every stream completes with the very tokens of an undisturbed run
(re-placed or migrated with its delivered tokens), a new request is served within
30 s, the supervisor has the killed actor serving again (next incarnation) within
120 s, and no worker holds KV blocks afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.conftest import own_cluster, wait_room_seen
from tests.integration.streams import Progress, run_streams, same_tokens
from tetriserve.common.request import Request, SamplingSpec

NAMESPACE = "tetriserve-test-failures"
SAMPLING = SamplingSpec(max_tokens=64, temperature=0.0, ignore_eos=True)
PROMPTS = {f"f-{i}": tuple(range(10 + 5 * i, 10 + 5 * i + 24 + 9 * i)) for i in range(8)}  # 4 per decode worker


@pytest.fixture(scope="module")
def cluster(model_path: str) -> Iterator[Any]:
    overrides = {
        "namespace": NAMESPACE,
        "num_prefill": 2,
        "num_decode": 2,
        "prefill.predictor": "baseline",
        "prefill.dispatch_policy": "round-robin",
    }
    with own_cluster(model_path, overrides) as handle:
        yield handle


@pytest.fixture(scope="module")
def undisturbed(cluster: Any) -> dict[str, tuple[int, ...]]:
    return _run(cluster, "ref")


def _run(cluster: Any, tag: str, kill: Callable[[], None] | None = None, after: int = 4) -> dict[str, tuple[int, ...]]:
    """Every prompt at once (ids ``<prompt>-<tag>``); ``kill()`` once every stream has ``after`` tokens
    (``after=0``: once the first token of any stream has come); ``kill`` runs on a thread of its own."""

    def ready(progress: Progress) -> bool:
        if after == 0:
            return max(progress.values(), default=0) > 0
        return len(progress) == len(PROMPTS) and min(progress.values()) >= after

    action = None if kill is None else (lambda _admin: asyncio.to_thread(kill))
    return run_streams(cluster, PROMPTS, SAMPLING, tag, action, ready)


def _kill(name: str) -> Callable[[], None]:
    def kill() -> None:
        import ray

        ray.kill(ray.get_actor(name, namespace=NAMESPACE))

    return kill


def _sigkill(name: str) -> Callable[[], None]:
    """SIGKILL the actor's process, as the kernel's OOM killer or a lost node would end it: Ray hears of it only
    from the dead process, not from a ``ray.kill``."""
    import os
    import signal

    import ray

    pid = ray.get(ray.get_actor(name, namespace=NAMESPACE).__ray_call__.remote(lambda self: os.getpid()))

    def kill() -> None:
        os.kill(pid, signal.SIGKILL)

    return kill


def _served_within(cluster: Any, seconds: float) -> None:
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")

    async def one() -> list[int]:
        try:
            out: list[int] = []
            async for chunk in backend.generate(Request(f"new-{time.monotonic_ns()}", (5, 6, 7, 8), SAMPLING)):
                assert chunk.finish_reason in (None, "length"), chunk.error
                out.extend(chunk.token_ids)
            return out
        finally:
            backend.close()

    t0 = time.monotonic()
    assert len(asyncio.run(one())) == SAMPLING.max_tokens
    assert time.monotonic() - t0 < seconds


def _back_within(cluster: Any, name: str, seconds: float, incarnation: int = 1) -> None:
    from tetriserve.control_plane.supervisor import ActorState

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        slot = cluster.supervision.sup.slots[name]
        if slot.state is ActorState.ACTIVE and slot.incarnation >= incarnation:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} not serving again within {seconds:.0f} s: {cluster.supervision.sup.slots[name]}")


def _no_kv_left(cluster: Any) -> None:
    import ray

    deadline = time.monotonic() + 30
    while True:
        stats = ray.get([h.stats.remote() for h in [*cluster.prefill.values(), *cluster.decode.values()]])
        held = [s["engine"].kv_usage for s in stats]
        if all(u == 0 for u in held):
            return
        assert time.monotonic() < deadline, f"KV blocks still held: {held}"
        time.sleep(0.2)


def test_a_decode_worker_killed_under_streams_loses_nothing(cluster: Any, undisturbed: Any) -> None:
    same_tokens(_run(cluster, "kd", _kill("decode-0"), after=8), undisturbed)
    _served_within(cluster, 30)
    _back_within(cluster, "decode-0", 120)
    _no_kv_left(cluster)


def test_a_decode_worker_whose_process_is_sigkilled_under_streams_loses_nothing(cluster: Any, undisturbed: Any) -> None:
    _back_within(cluster, "decode-0", 120)  # the previous test's victim
    same_tokens(_run(cluster, "ks9", _sigkill("decode-1"), after=8), undisturbed)
    _served_within(cluster, 30)
    _back_within(cluster, "decode-1", 120)
    _no_kv_left(cluster)


def test_a_prefill_worker_killed_with_requests_queued_and_mid_handoff_loses_nothing(
    cluster: Any, undisturbed: Any
) -> None:
    _back_within(cluster, "decode-1", 120)  # the previous test's victim
    same_tokens(_run(cluster, "kp", _kill("prefill-0"), after=0), undisturbed)
    _served_within(cluster, 30)
    _back_within(cluster, "prefill-0", 120)
    _no_kv_left(cluster)


def _decode_accepting(cluster: Any, accepting: bool) -> None:
    import ray

    def flip(worker: Any) -> None:
        worker.accepting = accepting

    ray.get([h.__ray_call__.remote(flip) for h in cluster.decode.values()])


def test_a_prefill_worker_killed_with_its_requests_all_mid_handoff_loses_nothing(
    cluster: Any, undisturbed: Any
) -> None:
    # no decode worker takes requests: each waits on its prefill worker after its first token, KV parked there,
    # until one does; prefill-1 dies with its half of them in that state (the deterministic mid-handoff case)
    _back_within(cluster, "prefill-0", 120)  # the previous test's victim
    _decode_accepting(cluster, False)
    kill = _kill("prefill-1")

    def kill_then_reopen() -> None:
        time.sleep(0.5)  # every prompt's first token is out well before: all are mid-handoff now
        kill()
        _decode_accepting(cluster, True)

    try:
        same_tokens(_run(cluster, "kh", kill_then_reopen, after=1), undisturbed)
    finally:
        _decode_accepting(cluster, True)
    _served_within(cluster, 30)
    _back_within(cluster, "prefill-1", 120)
    _no_kv_left(cluster)


def test_the_global_scheduler_killed_under_streams_leaves_them_untouched(cluster: Any, undisturbed: Any) -> None:
    same_tokens(_run(cluster, "ks", _kill("global-scheduler"), after=8), undisturbed)
    _served_within(cluster, 30)
    _back_within(cluster, "global-scheduler", 120)
    _no_kv_left(cluster)


def test_the_cluster_monitor_killed_under_streams_leaves_them_untouched(cluster: Any, undisturbed: Any) -> None:
    same_tokens(_run(cluster, "km", _kill("cluster-monitor"), after=8), undisturbed)
    _back_within(cluster, "cluster-monitor", 120)
    _served_within(cluster, 30)  # placement and dispatch see the workers again through the new monitor
    _no_kv_left(cluster)


def _offloading(max_local_prompts: int, offload_max_tokens: int) -> int:
    """Set every worker's room for offloaded prompts (decode) and short prompts' bound (prefill); the prompts the
    prefill workers have offloaded so far."""
    import ray

    decode = [ray.get_actor(f"decode-{i}", namespace=NAMESPACE) for i in range(2)]
    prefill = [ray.get_actor(f"prefill-{i}", namespace=NAMESPACE) for i in range(2)]
    ray.get([h.set_policy.remote({"max_local_prompts": max_local_prompts}) for h in decode])
    ray.get([h.set_policy.remote({"offload_max_tokens": offload_max_tokens}) for h in prefill])
    return sum(s["handoffs"]["offloaded"] for s in ray.get([h.stats.remote() for h in prefill]))


def test_a_decode_worker_killed_while_it_computes_offloaded_prompts_loses_nothing(
    cluster: Any, undisturbed: Any
) -> None:
    """The service's default (this module's cluster has it off): every prompt here is short enough to be offered
    to a decode worker before it queues, two per decode worker at once. decode-0 dies as the first token of any
    stream comes, computing or decoding the prompts it took; they are migrated like any other."""
    import ray

    _back_within(cluster, "cluster-monitor", 120)  # the previous test's victim
    changed = time.time()
    before = _offloading(2, 512)
    wait_room_seen([ray.get_actor(f"prefill-{i}", namespace=NAMESPACE) for i in range(2)], 2, since=changed)
    same_tokens(_run(cluster, "ko", _kill("decode-0"), after=0), undisturbed)
    _back_within(cluster, "decode-0", 120, incarnation=2)  # killed once before, in the first test
    assert _offloading(0, 0) > before
    _served_within(cluster, 30)
    _no_kv_left(cluster)
