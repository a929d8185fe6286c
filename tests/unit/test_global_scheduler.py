"""The direct data path without Ray: GlobalScheduler placement and table, workers streaming to the front door.

Fake workers publish into real ``StreamHub``s; ``RayBackend`` opens its real
streams to them through fake actor handles (real ZeroMQ sockets, fake Ray
calls), so what is tested is the production routing: placement is a decision,
tokens never pass through the GlobalScheduler. A lost attempt and its migration:
``test_frontdoor_migration.py``.
"""

from __future__ import annotations

import asyncio
import time

from tests.actor_fakes import FakeHandle
from tests.data_path_support import collect, fake_cluster, make_request, wait_until
from tetriserve.common.request import RequestState
from tetriserve.common.stream import PlacementRequest, StateEvent
from tetriserve.frontdoor.ray_backend import RayBackend


def test_tokens_come_straight_from_the_workers_in_order_across_handoff_and_a_slice_move() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster()
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(collect(backend, make_request("r", 6)))
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        # decode-0's tokens overtake the prefill worker's first token and its handoff marker
        w["decode-0"].submitted["r"] = w["prefill-0"].submitted["r"]
        w["decode-1"].submitted["r"] = w["prefill-0"].submitted["r"]
        w["decode-0"].emit("r", (11, 12), 1)
        await asyncio.sleep(0.01)
        w["prefill-0"].emit("r", (10,), 0)
        w["prefill-0"].emit("r", (), 1, moved_to="decode-0")
        w["decode-1"].emit("r", (14, 15), 4, "length")  # after a slice move, before decode-0's last token
        await asyncio.sleep(0.01)
        w["decode-0"].emit("r", (12, 13), 2)  # 12 again: a duplicate, dropped
        w["decode-0"].emit("r", (), 4, moved_to="decode-1")
        chunks = await asyncio.wait_for(run, 5)
        assert [t for c in chunks for t in c.token_ids] == [10, 11, 12, 13, 14, 15]
        assert chunks[-1].finish_reason == "length" and all(c.moved_to is None for c in chunks)
        assert [c.index for c in chunks] == [0, 1, 3, 4]
        await wait_until(lambda: not gs.table)  # the front door's finish reached the table
        assert [e.state for e in (await gs.recent())[-1].events][-1] is RequestState.FINISHED_LENGTH
        assert not any(n in ("record", "place") for n, _ in cluster.decode["decode-0"].calls)

    asyncio.run(main())


def test_a_chunk_of_another_attempt_is_dropped_and_a_client_that_leaves_aborts_where_the_request_is() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster()
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        stream = backend.generate(make_request("a"))
        first = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: "a" in w["prefill-0"].submitted)
        w["decode-1"].submitted["a"] = w["prefill-0"].submitted["a"]
        w["prefill-0"].emit("a", (99,), 0, attempt=7)  # a chunk of another attempt
        w["prefill-0"].emit("a", (10,), 0)
        assert (await asyncio.wait_for(first, 5)).token_ids == (10,)
        w["prefill-0"].emit("a", (), 1, moved_to="decode-1")
        w["decode-1"].emit("a", (11,), 1)
        assert (await asyncio.wait_for(anext(stream), 5)).token_ids == (11,)
        await stream.aclose()  # the client went away
        await wait_until(lambda: not gs.table)
        await wait_until(lambda: w["decode-1"].aborted == ["a"])  # over the intake, if attached: a moment later
        assert not w["prefill-0"].aborted
        assert gs.counts["aborted"] == 1

    asyncio.run(main())


def test_placement_waits_for_a_serving_prefill_worker_and_for_the_global_scheduler() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        loads, gs.prefill_loads = gs.prefill_loads, {}  # none serving (all restarting)
        real = cluster.scheduler
        cluster.scheduler = FakeHandle(object())  # and the GlobalScheduler is gone: ``place`` raises
        run = asyncio.create_task(collect(backend, make_request("r", 1)))
        await asyncio.sleep(0.5)
        cluster.scheduler = real  # back, still with no prefill worker serving
        await asyncio.sleep(0.5)
        assert not run.done() and "r" not in w["prefill-0"].submitted
        gs.prefill_loads = loads
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        w["prefill-0"].emit("r", (3,), 0, "length")
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [3]
        backend.placement_timeout_s = 0.3
        gs.prefill_loads = {}
        late = await asyncio.wait_for(collect(backend, make_request("s", 1)), 5)
        assert late[-1].finish_reason == "error" and late[-1].retry
        assert late[-1].error == "service unavailable: no prefill worker is serving"

    asyncio.run(main())


def test_placement_is_least_loaded_refuses_duplicates_and_the_table_follows_events() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster(prefill=2)
        now = time.time()
        a = await gs.place(PlacementRequest("a", 10, 8, now))
        b = await gs.place(PlacementRequest("b", 10, 8, now))
        assert {a.prefill_worker, b.prefill_worker} == {"prefill-0", "prefill-1"}
        assert (await gs.place(PlacementRequest("a", 10, 8, now))).error == "request id a is already in flight"
        await gs.record(
            [
                StateEvent("a", RequestState.DECODING, now + 3, "decode-0"),  # out of order: applied in time order
                StateEvent("a", RequestState.TRANSFERRING, now + 1, "prefill-0"),
                StateEvent("a", RequestState.DECODE_QUEUED, now + 2, "prefill-0", "decode-0", moved_to="decode-0"),
                StateEvent("a", RequestState.TRANSFERRING, now + 4, "decode-0", "decode-0 -> decode-1", 0, "decode-1"),
            ]
        )
        assert gs.table["a"].decode_worker == "decode-1" and gs.counts["moved"] == 1
        await gs.record([StateEvent("a", RequestState.FINISHED_STOPPED, now + 5, "frontdoor", "stop", 6)])
        await gs.record([StateEvent("a", RequestState.FINISHED_ABORTED, now + 6, "decode-1", "abort")])  # late: ignored
        assert "a" not in gs.table and gs.counts["finished"] == 1 and gs.counts["aborted"] == 0
        states = [e.state for e in (await gs.recent())[-1].events]
        assert states[1:] == [
            RequestState.PREFILLING,
            RequestState.TRANSFERRING,
            RequestState.DECODE_QUEUED,
            RequestState.DECODING,
            RequestState.TRANSFERRING,
            RequestState.FINISHED_STOPPED,
        ]
        assert cluster.prefill[(await gs.recent())[-1].prefill_worker or ""].called("observe_many") == [([(10, 6)],)]
        # a has left its prefill worker, b has not: the next request goes to a's
        await gs.place(PlacementRequest("c", 10, 8, now))
        assert gs.table["c"].prefill_worker == a.prefill_worker
        # a prefill worker removed (or flipped to decode) gets no more placements
        await gs.remove_prefill(b.prefill_worker or "")
        for rid in ("d", "e"):
            assert (await gs.place(PlacementRequest(rid, 10, 8, now))).prefill_worker == a.prefill_worker

    asyncio.run(main())
