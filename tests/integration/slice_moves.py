"""SCLS slice moves on real engines (§7): requests leave one decode worker at a slice boundary, their KV
shipped to another, and finish there with the very tokens they would have produced without moving.

The tests take ``cluster``: 1 prefill + 2 decode workers, slices of ``SLICE`` iterations, the monitor's automatic
rounds paced out of the way (Γ = 1 h), so the tests give the orders themselves and which requests move does not
depend on timing. ``test_elastic_roles.py`` collects them and runs them first on its cluster (a cluster start on
2 cores takes about 45 s), before its flips change the roles.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tetriserve.common.request import Request, RequestState, SamplingSpec

SLICE = 16
SAMPLING = SamplingSpec(max_tokens=256, temperature=0.0, ignore_eos=True)  # baseline estimate: 128
PROMPTS = {f"mv-{i}": tuple(range(10 + 7 * i, 10 + 7 * i + 40 + 13 * i)) for i in range(6)}  # 3 per worker


def _run(cluster: Any, tag: str, during: Any = None) -> dict[str, tuple[int, ...]]:
    """Every prompt at once, as ``<prompt>-<tag>`` (each run its own request ids); tokens by prompt."""
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")

    async def run_all() -> dict[str, tuple[int, ...]]:
        async def one(rid: str, ids: tuple[int, ...]) -> tuple[int, ...]:
            out: list[int] = []
            async for chunk in backend.generate(Request(f"{rid}-{tag}", ids, SAMPLING)):
                assert chunk.finish_reason in (None, "length"), chunk.error
                out.extend(chunk.token_ids)
            return tuple(out)

        tasks = [asyncio.create_task(one(rid, ids)) for rid, ids in PROMPTS.items()]
        if during is not None:
            await asyncio.to_thread(during)
        try:
            return dict(zip(PROMPTS, await asyncio.gather(*tasks), strict=True))
        finally:
            backend.close()

    return asyncio.run(run_all())


def _order_moves(cluster: Any, src: str, dst: str, want: int, dst_handle: Any = None) -> list[str]:
    """Order ``src`` to give everything long to ``dst`` (the monitor's ``rebalance`` call), again and again
    until ``want`` requests are marked: each order marks those decoding on ``src`` at that moment."""
    import ray

    from tetriserve.decode_worker.slices import Order

    address = {m["worker_id"]: m["address"] for m in ray.get(cluster.monitor.snapshot.remote())}[dst]
    order = Order(src, dst, 1e6, 0.0, 1.0, 1.0, 10_000, cluster.config.engine.block_size)
    handle = dst_handle if dst_handle is not None else cluster.decode[dst]
    picked: list[str] = []
    deadline = time.monotonic() + 120
    while len(set(picked)) < want:
        assert time.monotonic() < deadline, f"only {picked} were ever decoding on {src}"
        picked += ray.get(cluster.decode[src].rebalance.remote(order, address, handle))
        time.sleep(0.002)
    return picked


def test_moved_requests_keep_their_tokens_and_their_kv_is_shipped_not_recomputed(cluster: Any) -> None:
    import ray

    reference = _run(cluster, "ref")  # nobody moves: slices end nowhere without an order
    before = {w: ray.get(h.stats.remote()) for w, h in cluster.decode.items()}
    movers: list[str] = []
    moved = _run(cluster, "moved", during=lambda: movers.extend(_order_moves(cluster, "decode-0", "decode-1", 3)))
    after = {w: ray.get(h.stats.remote()) for w, h in cluster.decode.items()}

    assert moved == reference
    assert all(len(v) == SAMPLING.max_tokens for v in moved.values())
    assert len(set(movers)) == 3

    requests = {r.request_id: r for r in ray.get(cluster.scheduler.recent.remote(2 * len(PROMPTS)))}
    for rid in movers:
        states = [e.state for e in requests[rid].events]
        assert states.count(RequestState.TRANSFERRING) == 2, states  # prefill → decode-0, then the move
        assert requests[rid].decode_worker == "decode-1"

    def delta(worker: str, key: str) -> int:
        return int(after[worker]["policy"][key]) - int(before[worker]["policy"][key])

    assert (delta("decode-0", "slice_moved_out"), delta("decode-1", "slice_moved_in")) == (3, 3)
    assert delta("decode-0", "slice_kept") == 0
    # decode-1 took them over as KV: each engine request it ran (3 from prefill, 3 moved in) computed only
    # its newest token, every other token's KV came through the connector
    eng0, eng1 = before["decode-1"]["engine"], after["decode-1"]["engine"]
    kv0, kv1 = before["decode-1"]["kv"], after["decode-1"]["kv"]
    assert kv1.requests_loaded - kv0.requests_loaded == 6
    assert eng1.prompt_tokens_computed - eng0.prompt_tokens_computed == 6
    assert kv1.load_failures == kv0.load_failures


def test_a_destination_that_cannot_take_the_request_leaves_it_where_it_was(cluster: Any) -> None:
    import ray

    reference = _run(cluster, "ref2")
    kept_before = int(ray.get(cluster.decode["decode-0"].policies.remote())["slice_kept"])
    not_a_decode_worker = next(iter(cluster.prefill.values()))  # has no ``adopt``: every hand-over fails
    movers: list[str] = []
    kept = _run(
        cluster,
        "kept",
        during=lambda: movers.extend(_order_moves(cluster, "decode-0", "decode-1", 3, not_a_decode_worker)),
    )
    assert kept == reference  # nothing lost: each resumed on decode-0 from its own parked KV
    assert int(ray.get(cluster.decode["decode-0"].policies.remote())["slice_kept"]) - kept_before == len(movers)
    requests = {r.request_id: r for r in ray.get(cluster.scheduler.recent.remote(len(PROMPTS)))}
    assert all(requests[rid].decode_worker == "decode-0" for rid in movers)
