"""The direct data path without Ray: GlobalScheduler placement and table, workers streaming to the front door.

Fake workers publish into real ``StreamHub``s; ``RayBackend`` opens its real
streams to them through fake actor handles (real ZeroMQ sockets, fake Ray
calls), so what is tested is the production routing: placement is a decision,
tokens never pass through the GlobalScheduler.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.common.intake import IntakeMessage, Submit, serve_intake
from tetriserve.common.load import PrefillLoad
from tetriserve.common.outbox import StreamHub
from tetriserve.common.request import Request, RequestState, SamplingSpec
from tetriserve.common.stream import (
    FinishReason,
    Heartbeat,
    PlacementRequest,
    StateEvent,
    StreamChunk,
)
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.control_plane.ray_backend import RayBackend


class FakeWorker:
    """A worker's stream hub, with the requests it was given and the aborts it got."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.streams = StreamHub()
        self.submitted: dict[str, tuple[Request, str]] = {}
        self.aborted: list[str] = []
        self.aborts: list[tuple[str, int | None]] = []
        self.broken: bool | Exception = False  # set: its control stream fails at the next heartbeat (with this)
        self.forgot: set[str] = set()  # requests its heartbeats leave out (lost without a word)
        self.attaches = True  # unset: it leaves the front door's intake unattached (an older worker): Ray carries all
        self.routes: list[tuple[str, bytes]] = []  # the intake each subscription attached to
        self.early_attaches = 0  # attach calls to answer "no subscription here yet"
        self.reader: asyncio.Future[None] | None = None
        self.intake: list[IntakeMessage] = []  # what came over the intake

    def _beat(self, subscriber: str) -> Heartbeat:
        held = [(rid, r.attempt) for rid, (r, sub) in self.submitted.items() if sub == subscriber]
        return Heartbeat(self.worker_id, 0, tuple(h for h in held if h[0] not in self.forgot))

    async def subscribe(self, subscriber: str, address: str) -> Any:
        try:
            async for beat in self.streams.serve(subscriber, address, lambda: self._beat(subscriber), heartbeat_s=0.01):
                if isinstance(self.broken, Exception):
                    raise self.broken
                if self.broken:
                    raise ConnectionError("the worker's stream broke")
                yield beat
        finally:
            if self.reader is not None:
                self.reader.cancel()

    def attach_intake(self, subscriber: str, address: str, route: bytes) -> bool:
        """The front door's submits and aborts over ZeroMQ, as a worker's (``WorkerActor.attach_intake``)."""
        if not self.attaches:  # Ray's handle of a worker without the method raises at once, as this does
            raise AttributeError("attach_intake")
        if self.early_attaches > 0:  # the call overtook the subscription: not subscribed yet, as a worker says
            self.early_attaches -= 1
            return False
        self.routes.append((address, route))
        self.reader = asyncio.ensure_future(serve_intake(address, route, lambda m: self._deliver(m, subscriber)))
        return True

    def _deliver(self, message: IntakeMessage, subscriber: str) -> None:
        self.intake.append(message)
        if isinstance(message, Submit):
            self.submit(message.request, subscriber)
        else:
            self.abort(message.request_id, message.attempt)

    def submit(self, req: Request, subscriber: str) -> None:
        self.submitted[req.request_id] = (req, subscriber)

    def emit(self, rid: str, tokens: tuple[int, ...], index: int, finish: str | None = None, **kw: Any) -> None:
        _, sub = self.submitted[rid]
        reason = FinishReason(finish) if finish else None
        self.streams.publish(sub, StreamChunk(rid, tokens, reason, worker=self.worker_id, index=index, **kw))

    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        self.aborted.append(request_id)
        self.aborts.append((request_id, attempt))
        return True

    def observe(self, prompt_len: int, output_len: int) -> None:
        return None


@dataclass
class FakeCluster:
    scheduler: Any
    prefill: dict[str, Any]
    decode: dict[str, Any]
    model_path: str = ""
    config: Any = None
    monitor: Any = None
    dashboard_url: str = ""
    workers: dict[str, FakeWorker] = field(default_factory=dict)


def _cluster(prefill: int = 1, decode: int = 2) -> tuple[FakeCluster, GlobalScheduler]:
    workers = {f"prefill-{i}": FakeWorker(f"prefill-{i}") for i in range(prefill)}
    workers |= {f"decode-{i}": FakeWorker(f"decode-{i}") for i in range(decode)}
    handles = {wid: FakeHandle(w) for wid, w in workers.items()}
    p = {k: h for k, h in handles.items() if k.startswith("prefill")}
    d = {k: h for k, h in handles.items() if k.startswith("decode")}
    gs = GlobalScheduler(p)
    gs.prefill_loads = {wid: PrefillLoad(wid, 0, 0, 0, 0.0) for wid in p}  # the monitor's broadcast: all serve
    return FakeCluster(FakeHandle(gs), p, d, workers=workers), gs


def _req(rid: str, max_tokens: int = 8) -> Request:
    return Request(rid, (1, 2, 3), SamplingSpec(max_tokens=max_tokens))


async def _wait(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def _collect(backend: RayBackend, req: Request) -> list[StreamChunk]:
    return [c async for c in backend.generate(req)]


def test_tokens_come_straight_from_the_workers_in_order_across_handoff_and_a_slice_move() -> None:
    async def main() -> None:
        cluster, gs = _cluster()
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(_collect(backend, _req("r", 6)))
        await _wait(lambda: "r" in w["prefill-0"].submitted)
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
        await _wait(lambda: not gs.table)  # the front door's finish reached the table
        assert [e.state for e in (await gs.recent())[-1].events][-1] is RequestState.FINISHED_LENGTH
        assert not any(n in ("record", "place") for n, _ in cluster.decode["decode-0"].calls)

    asyncio.run(main())


def test_a_chunk_of_another_attempt_is_dropped_and_a_client_that_leaves_aborts_where_the_request_is() -> None:
    async def main() -> None:
        cluster, gs = _cluster()
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        stream = backend.generate(_req("a"))
        first = asyncio.ensure_future(anext(stream))
        await _wait(lambda: "a" in w["prefill-0"].submitted)
        w["decode-1"].submitted["a"] = w["prefill-0"].submitted["a"]
        w["prefill-0"].emit("a", (99,), 0, attempt=7)  # a chunk of another attempt
        w["prefill-0"].emit("a", (10,), 0)
        assert (await asyncio.wait_for(first, 5)).token_ids == (10,)
        w["prefill-0"].emit("a", (), 1, moved_to="decode-1")
        w["decode-1"].emit("a", (11,), 1)
        assert (await asyncio.wait_for(anext(stream), 5)).token_ids == (11,)
        await stream.aclose()  # the client went away
        await _wait(lambda: not gs.table)
        await _wait(lambda: w["decode-1"].aborted == ["a"])  # over the intake, if attached: a moment later
        assert not w["prefill-0"].aborted
        assert gs.counts["aborted"] == 1

    asyncio.run(main())


def test_a_broken_worker_stream_re_places_only_the_requests_on_that_worker_elsewhere() -> None:
    async def main() -> None:
        cluster, _ = _cluster(prefill=2)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        runs = {rid: asyncio.create_task(_collect(backend, _req(rid, 2))) for rid in ("a", "b")}
        await _wait(lambda: all(any(rid in x.submitted for x in w.values()) for rid in runs))
        on = {rid: next(wid for wid, x in w.items() if rid in x.submitted) for rid in runs}
        assert set(on.values()) == {"prefill-0", "prefill-1"}
        w[on["a"]].broken = True
        # before its first token: placed again (attempt 1) on the other prefill worker, invisibly
        await _wait(lambda: w[on["b"]].submitted.get("a", (None,))[0] is not None)
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
        cluster, gs = _cluster(prefill=1, decode=2)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(_collect(backend, _req("r", 5)))
        await _wait(lambda: "r" in w["prefill-0"].submitted)
        w["decode-0"].submitted["r"] = w["prefill-0"].submitted["r"]
        w["prefill-0"].emit("r", (10,), 0)
        w["prefill-0"].emit("r", (), 1, moved_to="decode-0")
        w["decode-0"].emit("r", (11,), 1)
        await _wait(lambda: gs.table.get("r") is not None)
        await asyncio.sleep(0.05)
        w["decode-0"].broken = True  # decode-0 dies with the request mid-stream
        await _wait(lambda: w["prefill-0"].submitted["r"][0].attempt == 1)
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
        await _wait(lambda: not gs.table)
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
        cluster, _ = _cluster(prefill=1, decode=3)
        monitor = _Monitor()
        cluster.monitor = FakeHandle(monitor)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(_collect(backend, _req("r", 1)))
        await _wait(lambda: "r" in w["prefill-0"].submitted)
        w["decode-1"].broken = ConnectionError("a broken connection: the worker may live")
        w["decode-0"].broken = ActorDiedError()  # Ray: that life is over (killed, or its process gone)
        await _wait(lambda: bool(monitor.dead))
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
        cluster, _ = _cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(_collect(backend, _req("r", 3)))
        await _wait(lambda: "r" in w["prefill-0"].submitted)
        w["decode-0"].broken = True  # its life ends: its stream is down
        await _wait(lambda: "decode-0" in backend.streams().down)
        w["decode-0"] = new = _SlowToSubscribe("decode-0")  # the supervisor re-creates it
        cluster.decode = {"decode-0": FakeHandle(new)}
        await _wait(lambda: backend.streams()._handles["decode-0"].obj is new, timeout=3)
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
        cluster, _ = _cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        backend.migration_limit = 2
        run = asyncio.create_task(_collect(backend, _req("r", 5)))
        for attempt in range(3):
            await _wait(
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
        cluster, _ = _cluster(prefill=3, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        run = asyncio.create_task(_collect(backend, _req("r", 1)))
        lost_on: list[str] = []

        def holding(attempt: int) -> list[str]:
            return [wid for wid, x in w.items() if "r" in x.submitted and x.submitted["r"][0].attempt == attempt]

        for attempt in range(4):
            await _wait(lambda a=attempt: bool(holding(a)))
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
        cluster, _ = _cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        backend.idle_timeout_s = 0.3
        run = asyncio.create_task(_collect(backend, _req("r", 2)))
        await _wait(lambda: "r" in w["prefill-0"].submitted)
        await asyncio.sleep(1.0)  # listed by prefill-0's heartbeats: alive, however long it queues
        assert w["prefill-0"].submitted["r"][0].attempt == 0
        w["prefill-0"].forgot.add("r")  # the worker lost it without a word
        await _wait(lambda: w["prefill-0"].submitted["r"][0].attempt == 1, timeout=5)
        w["prefill-0"].emit("r", (1, 2), 0, "length", attempt=1)
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [1, 2]
        assert backend.migrations == {"idle_timeout": 1}

    asyncio.run(main())


def test_placement_waits_for_a_serving_prefill_worker_and_for_the_global_scheduler() -> None:
    async def main() -> None:
        cluster, gs = _cluster(prefill=1, decode=1)
        w = cluster.workers
        backend = RayBackend(cluster, "m")  # type: ignore[arg-type]
        loads, gs.prefill_loads = gs.prefill_loads, {}  # none serving (all restarting)
        real = cluster.scheduler
        cluster.scheduler = FakeHandle(object())  # and the GlobalScheduler is gone: ``place`` raises
        run = asyncio.create_task(_collect(backend, _req("r", 1)))
        await asyncio.sleep(0.5)
        cluster.scheduler = real  # back, still with no prefill worker serving
        await asyncio.sleep(0.5)
        assert not run.done() and "r" not in w["prefill-0"].submitted
        gs.prefill_loads = loads
        await _wait(lambda: "r" in w["prefill-0"].submitted)
        w["prefill-0"].emit("r", (3,), 0, "length")
        assert [t for c in await asyncio.wait_for(run, 5) for t in c.token_ids] == [3]
        backend.placement_timeout_s = 0.3
        gs.prefill_loads = {}
        late = await asyncio.wait_for(_collect(backend, _req("s", 1)), 5)
        assert late[-1].finish_reason == "error" and late[-1].retry
        assert late[-1].error == "service unavailable: no prefill worker is serving"

    asyncio.run(main())


def test_placement_is_least_loaded_refuses_duplicates_and_the_table_follows_events() -> None:
    async def main() -> None:
        cluster, gs = _cluster(prefill=2)
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
        assert cluster.prefill[(await gs.recent())[-1].prefill_worker or ""].called("observe") == [(10, 6)]
        # a has left its prefill worker, b has not: the next request goes to a's
        await gs.place(PlacementRequest("c", 10, 8, now))
        assert gs.table["c"].prefill_worker == a.prefill_worker
        # a prefill worker removed (or flipped to decode) gets no more placements
        await gs.remove_prefill(b.prefill_worker or "")
        for rid in ("d", "e"):
            assert (await gs.place(PlacementRequest(rid, 10, 8, now))).prefill_worker == a.prefill_worker

    asyncio.run(main())
