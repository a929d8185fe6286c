"""GlobalScheduler lifecycle, placement, aborts and the multiplexed relay, with fake workers (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from common.outbox import Outbox
from common.request import Request, RequestState, SamplingSpec
from common.stream import Handoff, StreamChunk
from control_plane.global_scheduler import GlobalScheduler
from tests.actor_fakes import FakeHandle


class FakePrefill:
    """Yields the first token, then hands off to ``decode-0`` (or finishes when max_tokens == 1)."""

    def __init__(self, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.fail = fail
        self.gate = gate

    async def prefill(self, req: Request) -> AsyncIterator[Any]:
        if self.fail:
            raise RuntimeError("prefill worker crashed")
        if self.gate is not None:
            await self.gate.wait()
        done = req.sampling.max_tokens == 1
        yield StreamChunk(req.request_id, (7,), "length" if done else None, None, len(req.prompt_token_ids))
        if not done:
            yield Handoff(req.request_id, "decode-0")

    def observe(self, prompt_len: int, output_len: int) -> None:
        return None

    def abort(self, request_id: str) -> bool:
        return True


class FakeDecode:
    def __init__(self) -> None:
        self.outbox = Outbox()

    async def subscribe(self) -> AsyncIterator[list[StreamChunk]]:
        async for batch in self.outbox.batches():
            yield batch

    def emit(self, rid: str, tokens: tuple[int, ...], finish: str | None = None) -> None:
        self.outbox.put(StreamChunk(rid, tokens, finish))

    def abort(self, request_id: str) -> bool:
        self.emit(request_id, (), "abort")
        return True

    def discard(self, key: str) -> None:
        return None


def _req(rid: str, max_tokens: int = 4) -> Request:
    return Request(rid, (1, 2, 3), SamplingSpec(max_tokens=max_tokens))


async def _collect(gs: GlobalScheduler, sub: str, until: set[str]) -> dict[str, list[StreamChunk]]:
    got: dict[str, list[StreamChunk]] = {}
    async for batch in gs.subscribe(sub):
        for chunk in batch:
            got.setdefault(chunk.request_id, []).append(chunk)
            if chunk.finish_reason is not None:
                until.discard(chunk.request_id)
        if not until:
            return got
    return got


def _cluster(**prefill_kw: Any) -> tuple[GlobalScheduler, dict[str, FakeHandle], FakeDecode, FakeHandle]:
    decode = FakeDecode()
    dh = FakeHandle(decode)
    ph = {"prefill-0": FakeHandle(FakePrefill(**prefill_kw)), "prefill-1": FakeHandle(FakePrefill(**prefill_kw))}
    return GlobalScheduler(ph, {"decode-0": dh}), ph, decode, dh


def test_full_lifecycle_relays_every_token_in_order_and_records_events() -> None:
    async def main() -> None:
        gs, ph, decode, _ = _cluster()
        collector = asyncio.create_task(_collect(gs, "fd", {"a"}))
        await asyncio.sleep(0)
        assert gs.submit(_req("a"), "fd") is None
        while "a" not in gs.table or gs.table["a"].request.state < RequestState.DECODE_QUEUED:
            await asyncio.sleep(0.001)
        decode.emit("a", (8, 9))
        decode.emit("a", (10,), "length")
        got = await asyncio.wait_for(collector, 5)
        assert [t for c in got["a"] for t in c.token_ids] == [7, 8, 9, 10]
        req = gs.recent()[-1]
        assert [e.state for e in req.events] == [
            RequestState.QUEUED,
            RequestState.PREFILLING,
            RequestState.TRANSFERRING,
            RequestState.DECODE_QUEUED,
            RequestState.DECODING,
            RequestState.FINISHED_LENGTH,
        ]
        assert gs.status()["in_flight"] == 0 and gs.counts["finished"] == 1
        observed = [args for h in ph.values() for args in h.called("observe")]
        assert observed == [(3, 4)]

    asyncio.run(main())


def test_request_finished_at_prefill_never_touches_decode() -> None:
    async def main() -> None:
        gs, _, _, dh = _cluster()
        collector = asyncio.create_task(_collect(gs, "fd", {"one"}))
        await asyncio.sleep(0)
        gs.submit(_req("one", max_tokens=1), "fd")
        got = await asyncio.wait_for(collector, 5)
        assert got["one"][-1].finish_reason == "length"
        assert gs.recent()[-1].state is RequestState.FINISHED_LENGTH
        assert not dh.called("abort")

    asyncio.run(main())


def test_abort_racing_the_handoff_reaches_the_decode_worker() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        gs, _, _, dh = _cluster(gate=gate)
        collector = asyncio.create_task(_collect(gs, "fd", {"r"}))
        await asyncio.sleep(0)
        gs.submit(_req("r"), "fd")
        await asyncio.sleep(0.01)
        assert await gs.abort("r")  # decode worker not chosen yet
        gate.set()
        got = await asyncio.wait_for(collector, 5)
        assert got["r"][-1].finish_reason == "abort"
        assert ("r",) in dh.called("abort")
        assert gs.recent()[-1].state is RequestState.FINISHED_ABORTED

    asyncio.run(main())


def test_duplicate_request_id_is_refused() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        gs, _, _, _ = _cluster(gate=gate)
        assert gs.submit(_req("dup"), "fd") is None
        assert "already in flight" in (gs.submit(_req("dup"), "fd") or "")
        await gs.abort("dup")
        gate.set()

    asyncio.run(main())


def test_least_loaded_prefill_worker_is_chosen() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        gs, _, _, _ = _cluster(gate=gate)
        for i in range(4):
            gs.submit(_req(f"q{i}"), "fd")
            await asyncio.sleep(0.001)
        placed = sorted(e.request.prefill_worker or "" for e in gs.table.values())
        assert placed == ["prefill-0", "prefill-0", "prefill-1", "prefill-1"]
        for rid in list(gs.table):
            await gs.abort(rid)
        gate.set()

    asyncio.run(main())


def test_a_crashing_worker_fails_the_request_not_the_scheduler() -> None:
    async def main() -> None:
        gs, _, _, _ = _cluster(fail=True)
        collector = asyncio.create_task(_collect(gs, "fd", {"x"}))
        await asyncio.sleep(0)
        gs.submit(_req("x"), "fd")
        got = await asyncio.wait_for(collector, 5)
        assert got["x"][-1].finish_reason == "error" and "crashed" in (got["x"][-1].error or "")
        assert gs.recent()[-1].state is RequestState.FINISHED_ERROR and gs.counts["errors"] == 1

    asyncio.run(main())


def test_outbox_batches_everything_ready() -> None:
    async def main() -> None:
        box = Outbox()
        for i in range(5):
            box.put(StreamChunk(f"r{i % 2}", (i,)))
        batches = box.batches()
        first = await batches.__anext__()
        assert [c.token_ids[0] for c in first] == [0, 1, 2, 3, 4]
        assert len(box) == 0
        box.put(StreamChunk("r0", (9,), "stop"))
        assert [c.token_ids for c in await batches.__anext__()] == [(9,)]

    asyncio.run(main())


def test_a_slice_move_relays_tokens_in_order_and_aborts_go_where_the_request_is() -> None:
    async def main() -> None:
        d0, d1 = FakeDecode(), FakeDecode()
        h0, h1 = FakeHandle(d0), FakeHandle(d1)
        gs = GlobalScheduler({"prefill-0": FakeHandle(FakePrefill())}, {"decode-0": h0, "decode-1": h1})
        collector = asyncio.create_task(_collect(gs, "fd", {"m"}))
        await asyncio.sleep(0)
        gs.submit(_req("m", max_tokens=10), "fd")
        while "m" not in gs.table or gs.table["m"].request.state < RequestState.DECODE_QUEUED:
            await asyncio.sleep(0.001)
        d0.outbox.put(StreamChunk("m", (8, 9), worker="decode-0"))
        await asyncio.sleep(0.01)
        d1.outbox.put(StreamChunk("m", (11,), worker="decode-1"))  # overtakes the rest of decode-0's part
        await asyncio.sleep(0.01)
        d0.outbox.put(StreamChunk("m", (10,), worker="decode-0"))
        d0.outbox.put(StreamChunk("m", (), worker="decode-0", moved_to="decode-1"))
        while gs.table["m"].request.decode_worker != "decode-1":
            await asyncio.sleep(0.001)
        await gs.abort("m")
        got = await asyncio.wait_for(collector, 5)
        assert [t for c in got["m"] for t in c.token_ids] == [7, 8, 9, 10, 11]
        assert all(c.moved_to is None for c in got["m"])  # the marker stays in the control plane
        assert set(h1.called("abort")) == {("m",)} and not h0.called("abort")
        states = [e.state for e in gs.recent()[-1].events]
        assert states[3:] == [
            RequestState.DECODE_QUEUED,
            RequestState.DECODING,
            RequestState.TRANSFERRING,
            RequestState.DECODE_QUEUED,
            RequestState.DECODING,
            RequestState.FINISHED_ABORTED,
        ]
        assert gs.counts["moved"] == 1

    asyncio.run(main())
