"""A request's attempt lost and placed again, without Ray (frontdoor/ray_backend.py, frontdoor/worker_streams.py):
broken or silent worker streams, a worker Ray says died, a worker's new life, the migration limit, and where
the next attempt goes. Fakes: ``tests/data_path_support.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.actor_fakes import FakeHandle
from tests.data_path_support import FakeWorker, collect, fake_cluster, make_request, wait_until
from tetriserve.frontdoor.ray_backend import RayBackend


def test_a_broken_worker_stream_re_places_only_the_requests_on_that_worker_elsewhere() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(prefill=2)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        runs = {rid: asyncio.create_task(collect(backend, make_request(rid, 2))) for rid in ("a", "b")}
        await wait_until(lambda: all(any(rid in x.submitted for x in w.values()) for rid in runs))
        on = {rid: next(wid for wid, x in w.items() if rid in x.submitted) for rid in runs}
        assert set(on.values()) == {"prefill-0", "prefill-1"}
        w[on["a"]].broken = True
        # before its first token: placed again (attempt 1) on the other prefill worker, invisibly
        await wait_until(lambda: w[on["b"]].submitted.get("a", (None,))[0] is not None)
        again, _ = w[on["b"]].submitted["a"]
        assert again.attempt == 1 and again.resume == ()
        assert not runs["b"].done()
        w[on["b"]].emit("a", (7, 8), 0, "length", attempt=1)
        w[on["b"]].emit("b", (1, 2), 0, "length")
        assert [t for c in await asyncio.wait_for(runs["a"], 5) for t in c.token_ids] == [7, 8]
        assert [t for c in await asyncio.wait_for(runs["b"], 5) for t in c.token_ids] == [1, 2]

    asyncio.run(main())


def test_a_decode_worker_lost_mid_stream_migrates_with_the_delivered_tokens_and_nothing_repeats() -> None:
    async def main() -> None:
        cluster, gs = fake_cluster(prefill=1, decode=2)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(collect(backend, make_request("r", 5)))
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        w["decode-0"].submitted["r"] = w["prefill-0"].submitted["r"]
        w["prefill-0"].emit("r", (10,), 0)
        w["prefill-0"].emit("r", (), 1, moved_to="decode-0")
        w["decode-0"].emit("r", (11,), 1)
        await wait_until(lambda: gs.table.get("r") is not None)
        await asyncio.sleep(0.05)
        w["decode-0"].broken = True  # decode-0 dies with the request mid-stream
        await wait_until(lambda: w["prefill-0"].submitted["r"][0].attempt == 1)
        again, _ = w["prefill-0"].submitted["r"]
        assert again.resume == (10, 11)  # re-prefill prompt + what the client has
        assert ("r", 0) in w["decode-1"].aborts and ("r", 0) in w["prefill-0"].aborts  # the old attempt, everywhere
        w["decode-0"].emit("r", (12,), 2)  # the old attempt's last words: dropped
        w["prefill-0"].emit("r", (22,), 2, attempt=1)
        w["prefill-0"].emit("r", (), 3, moved_to="decode-1", attempt=1)
        w["decode-1"].submitted["r"] = w["prefill-0"].submitted["r"]
        w["decode-1"].emit("r", (23, 24), 3, "length", attempt=1)
        chunks = await asyncio.wait_for(run, 5)
        assert [t for c in chunks for t in c.token_ids] == [10, 11, 22, 23, 24]
        assert chunks[-1].finish_reason == "length"
        await wait_until(lambda: not gs.table)
        assert gs.counts["finished"] == 1
        assert backend.migrations == {"worker_lost": 1}  # the metrics' request_migrations_total

    asyncio.run(main())


class _Monitor:
    def __init__(self) -> None:
        self.dead: list[tuple[str, int]] = []

    def mark_dead(self, worker_id: str, incarnation: int) -> None:
        self.dead.append((worker_id, incarnation))


def test_a_stream_that_ray_says_died_takes_that_worker_out_of_dispatch_at_once() -> None:
    from ray.exceptions import ActorDiedError

    async def main() -> None:
        cluster, _ = fake_cluster(prefill=1, decode=3)
        monitor = _Monitor()
        cluster.monitor = FakeHandle(monitor)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(collect(backend, make_request("r", 1)))
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        w["decode-1"].broken = ConnectionError("a broken connection: the worker may live")
        w["decode-0"].broken = ActorDiedError()  # Ray: that life is over (killed, or its process gone)
        await wait_until(lambda: bool(monitor.dead))
        await asyncio.sleep(0.1)
        assert monitor.dead == [("decode-0", 0)]  # told once, for the dead one only
        w["prefill-0"].emit("r", (5,), 0, "length")
        await asyncio.wait_for(run, 5)

    asyncio.run(main())


class _SlowToSubscribe(FakeWorker):
    """A new life of a worker whose stream from the front door is not up yet (no heartbeat) until ``go``."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.go = asyncio.Event()

    async def subscribe(self, subscriber: str, address: str) -> Any:
        await self.go.wait()
        async for beat in super().subscribe(subscriber, address):
            yield beat


def test_a_request_handed_to_a_new_life_before_its_first_heartbeat_is_not_lost() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(collect(backend, make_request("r", 3)))
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        w["decode-0"].broken = True  # its life ends: its stream is down
        await wait_until(lambda: "decode-0" in backend.streams().down)
        w["decode-0"] = new = _SlowToSubscribe("decode-0")  # the supervisor re-creates it
        cluster.decode = {"decode-0": FakeHandle(new)}
        await wait_until(lambda: backend.streams()._handles["decode-0"].obj is new, timeout=3)
        w["prefill-0"].emit("r", (10,), 0)  # a waiting prefill worker hands it over at once
        w["prefill-0"].emit("r", (), 1, moved_to="decode-0")
        await asyncio.sleep(0.1)  # the moved_to marker is in before the new life's first heartbeat
        new.submitted["r"] = w["prefill-0"].submitted["r"]
        new.emit("r", (11, 12), 1, "length")  # waits in its hub for the stream
        new.go.set()
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [10, 11, 12]
        assert not backend.migrations  # the same attempt, not placed again

    asyncio.run(main())


def test_migration_gives_up_after_its_limit_with_an_unavailable_error() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        backend.migration_limit = 2
        run = asyncio.create_task(collect(backend, make_request("r", 5)))
        for attempt in range(3):
            await wait_until(
                lambda a=attempt: "r" in w["prefill-0"].submitted and w["prefill-0"].submitted["r"][0].attempt == a
            )
            w["prefill-0"].emit(
                "r", (), 0, "error", error="decode worker decode-0 is unavailable", attempt=attempt, retry=True
            )
        chunks = await asyncio.wait_for(run, 5)
        assert chunks[-1].finish_reason == "error" and chunks[-1].retry
        assert (chunks[-1].error or "").startswith("service unavailable")
        assert backend.migrations == {"worker_gave_up": 2}  # placed again twice, then given up

    asyncio.run(main())


def test_each_attempt_goes_to_a_prefill_worker_no_earlier_attempt_was_lost_on_while_one_serves() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(prefill=3, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(collect(backend, make_request("r", 1)))
        lost_on: list[str] = []

        def holding(attempt: int) -> list[str]:
            return [wid for wid, x in w.items() if "r" in x.submitted and x.submitted["r"][0].attempt == attempt]

        for attempt in range(4):
            await wait_until(lambda a=attempt: bool(holding(a)))
            (on,) = holding(attempt)
            if attempt < 3:
                assert on not in lost_on  # not a worker an earlier attempt was lost on
                lost_on.append(on)
                w[on].emit("r", (), 0, "error", error="decode-0 is unavailable", attempt=attempt, retry=True)
        w[on].emit("r", (5,), 0, "length", attempt=3)  # every one was avoided: placed on any that serves
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [5]

    asyncio.run(main())


def test_a_request_no_heartbeat_lists_and_no_token_comes_for_is_migrated_after_the_idle_deadline() -> None:
    async def main() -> None:
        cluster, _ = fake_cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        backend.idle_timeout_s = 0.3
        run = asyncio.create_task(collect(backend, make_request("r", 2)))
        await wait_until(lambda: "r" in w["prefill-0"].submitted)
        await asyncio.sleep(1.0)  # listed by prefill-0's heartbeats: alive, however long it queues
        assert w["prefill-0"].submitted["r"][0].attempt == 0
        w["prefill-0"].forgot.add("r")  # the worker lost it without a word
        await wait_until(lambda: w["prefill-0"].submitted["r"][0].attempt == 1, timeout=5)
        w["prefill-0"].emit("r", (1, 2), 0, "length", attempt=1)
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [1, 2]
        assert backend.migrations == {"idle_timeout": 1}

    asyncio.run(main())
