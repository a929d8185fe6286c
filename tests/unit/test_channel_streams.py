"""A worker's multiplexed output streams (channel/streams.py) and their wire format (common/stream.py)."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from tetriserve.channel import core
from tetriserve.channel.streams import STREAM_MESSAGES, Chunks, StreamHub, coalesce
from tetriserve.common.stream import FinishReason, StreamChunk, TokenLogprobs


def test_a_hub_coalesces_each_requests_contiguous_deltas_and_keeps_the_rest_apart() -> None:
    chunks = [
        StreamChunk("x", (1,), worker="d0", index=0),
        StreamChunk("y", (5,), worker="d0", index=3),
        StreamChunk("x", (2, 3), worker="d0", index=1),
        StreamChunk("x", (4,), FinishReason.STOP, worker="d0", index=3),
        StreamChunk("y", (), worker="d0", index=4, moved_to="d1"),
        StreamChunk("y", (6,), worker="d0", index=4),
    ]
    out = coalesce(chunks)
    assert [(c.request_id, c.token_ids, c.index, c.finish_reason) for c in out] == [
        ("x", (1, 2, 3, 4), 0, "stop"),
        ("y", (5,), 3, None),
        ("y", (), 4, None),
        ("y", (6,), 4, None),
    ]


def test_chunks_cross_the_wire_unchanged_and_a_malformed_batch_is_refused() -> None:
    lps = (TokenLogprobs((1, 7), (-0.5, -1.5)), TokenLogprobs((2,), (-0.1,)))
    chunks = (
        StreamChunk("a", (1, 2), FinishReason.STOP, None, 3, "decode-0", {"queue_s": 0.5}, None, 4, 1, 2, True, lps),
        StreamChunk("b", (), None, "why", 0, "prefill-0", None, "decode-1", 0, 0),
    )
    got = core.decode(core.encode(Chunks(chunks)), STREAM_MESSAGES)
    assert got == Chunks(chunks) and got.chunks[0].finish_reason is FinishReason.STOP
    for rows in ([["a", [1]]], [[7, [], None, None, 0, "w", None, None, 0, 0, 0, False, None]], "rows"):
        with pytest.raises(ValueError, match=r"Chunks\.chunks"):
            core.decode(msgpack.packb([core.WIRE_VERSION, core.kind_of(Chunks), 0, rows]), STREAM_MESSAGES)


def test_a_hub_sends_one_coalesced_message_per_loop_turn_and_holds_chunks_until_a_sink_attaches() -> None:
    async def main() -> None:
        hub = StreamHub()
        sent: list[list[StreamChunk]] = []
        hub.publish("fd", StreamChunk("x", (1,), worker="d0", index=0))  # before anyone listens: held
        with hub.attach("fd", sent.append):
            assert [c.token_ids for b in sent for c in b] == [(1,)]
            for i in range(2, 5):  # one engine step's deltas, published in one turn
                hub.publish("fd", StreamChunk("x", (i,), worker="d0", index=i - 1))
            hub.publish("other", StreamChunk("y", (9,), worker="d0"))  # nobody attached for it: held
            await asyncio.sleep(0)
            assert len(sent) == 2 and [(c.token_ids, c.index) for c in sent[1]] == [((2, 3, 4), 1)]
        hub.publish("fd", StreamChunk("x", (5,), worker="d0", index=4))
        await asyncio.sleep(0)
        assert len(sent) == 2  # detached: nothing goes to the old sink

    asyncio.run(main())


def test_a_newer_stream_of_the_same_subscriber_takes_its_chunks_over_and_the_older_one_ends() -> None:
    """A front door that took its stream for broken opens another while the worker's side of the first still
    runs: the newer one gets the chunks at once, and the older one's end leaves the newer one attached."""

    async def main() -> None:
        hub = StreamHub()
        old: list[list[StreamChunk]] = []
        new: list[list[StreamChunk]] = []
        with hub.attach("fd", old.append):
            with hub.attach("fd", new.append):
                hub.publish("fd", StreamChunk("x", (1,), worker="d0", index=0))
                await asyncio.sleep(0)
                assert [c.token_ids for b in new for c in b] == [(1,)] and old == []
            assert not hub.attached("fd")  # the newer one ended first: detached
        assert not hub.attached("fd")

        old.clear()
        new.clear()
        old_sink, new_sink = old.append, new.append
        outer = hub.attach("fd", old_sink)
        outer.__enter__()
        with hub.attach("fd", new_sink):
            assert hub.current("fd", new_sink) and not hub.current("fd", old_sink)
            outer.__exit__(None, None, None)  # the older stream ends while the newer one is open
            assert hub.attached("fd") and hub.current("fd", new_sink)
            hub.publish("fd", StreamChunk("x", (2,), worker="d0", index=1))
            await asyncio.sleep(0)
            assert [c.token_ids for b in new for c in b] == [(2,)] and old == []
        assert not hub.attached("fd")

    asyncio.run(main())


def test_a_subscribers_heartbeat_stream_ends_when_a_newer_one_takes_over() -> None:
    async def main() -> None:
        hub = StreamHub()
        first = hub.serve("fd", "tcp://127.0.0.1:1", lambda: "beat", heartbeat_s=0.01)
        assert await first.__anext__() == "beat"
        second = hub.serve("fd", "tcp://127.0.0.1:1", lambda: "beat", heartbeat_s=0.01)
        assert await second.__anext__() == "beat"  # takes over
        with pytest.raises(StopAsyncIteration):
            await first.__anext__()  # the older stream ends at its next heartbeat
        assert hub.attached("fd")  # and leaves the newer one attached
        assert await second.__anext__() == "beat"
        await second.aclose()
        assert not hub.attached("fd")

    asyncio.run(main())


def test_chunks_staged_on_another_thread_go_out_from_it_after_what_the_loop_published_before_them() -> None:
    import threading

    async def main() -> None:
        hub = StreamHub()
        sent: list[tuple[str, list[StreamChunk]]] = []

        def sink(batch: list[StreamChunk]) -> None:
            sent.append((threading.current_thread().name, batch))

        with hub.attach("fd", sink, threadsafe=True):
            hub.publish("fd", StreamChunk("x", (1,), worker="d0", index=0))  # the loop's, not flushed yet

            def engine_step() -> None:
                hub.stage("fd", StreamChunk("x", (2,), worker="d0", index=1))
                hub.stage("fd", StreamChunk("y", (7,), worker="d0", index=0))
                hub.stage("late", StreamChunk("z", (8,), worker="d0", index=0))  # nobody attached yet: held
                hub.send_staged()
                hub.send_staged()  # nothing staged since: nothing sent

            thread = threading.Thread(target=engine_step, name="eng")
            thread.start()
            thread.join()
            assert [(name, [(c.request_id, c.token_ids) for c in b]) for name, b in sent] == [
                ("eng", [("x", (1, 2)), ("y", (7,))])  # one message, the loop's chunk first, coalesced
            ]
            await asyncio.sleep(0)  # the loop's own flush finds nothing left
            assert len(sent) == 1
            late: list[list[StreamChunk]] = []
            with hub.attach("late", late.append):
                assert [c.token_ids for b in late for c in b] == [(8,)]

    asyncio.run(main())


def test_a_sink_that_is_not_threadsafe_gets_the_staged_chunks_on_its_event_loop() -> None:
    import threading

    async def main() -> None:
        hub = StreamHub()
        got: asyncio.Queue[tuple[str, list[StreamChunk]]] = asyncio.Queue()
        with hub.attach("fd", lambda b: got.put_nowait((threading.current_thread().name, b))):
            thread = threading.Thread(
                target=lambda: (hub.stage("fd", StreamChunk("x", (1,), worker="d0")), hub.send_staged()), name="eng"
            )
            thread.start()
            thread.join()
            name, batch = await asyncio.wait_for(got.get(), 5)
            assert name == threading.current_thread().name and [c.token_ids for c in batch] == [(1,)]

    asyncio.run(main())
