"""A prefill worker's handoff calls on a decode worker over ZeroMQ (common/handoff_channel.py): the wire, the
server and the link, and the decode peer that falls back to Ray (prefill_worker/decode_peers.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack
import pytest

from tests.waiting import until
from tetriserve.common.handoff_channel import (
    Discard,
    HandoffError,
    HandoffLink,
    HandoffMessage,
    HandoffServer,
    KvFailed,
    PullKV,
    Refine,
    Reply,
    Take,
    decode,
    encode,
)
from tetriserve.common.intake import Abort
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.wire import WIRE_VERSION, kind_of
from tetriserve.common.wire import encode as encode_other
from tetriserve.prefill_worker.decode_peers import DecodePeer

REQ = Request("r1", (5, 6, 7), SamplingSpec(max_tokens=9, temperature=0.5, stop=("x",)), attempt=2, resume=(4,))
EST = LengthEstimate(10, 15, 20, bucket=1, confidence=0.5, source="test")


@pytest.mark.parametrize(
    "message",
    [
        Take(3, REQ, (8,), EST, "frontdoor-1", "tcp://10.0.0.1:5", False),
        Take(4, REQ, (), None, "frontdoor-1", None, True),
        PullKV("shm://prefill-0", "r1#2"),
        Refine("r1", 2, EST),
        Discard("r1#2"),
        KvFailed("r1#2", "send failed"),
        Reply(3, True),
        Reply(4, False, "RuntimeError: boom"),
    ],
)
def test_every_message_comes_back_as_it_was_sent(message: HandoffMessage) -> None:
    assert decode(encode(message)) == message


@pytest.mark.parametrize(
    "data",
    [
        b"\x00not msgpack",
        msgpack.packb([WIRE_VERSION + 1, kind_of(Discard), "k"]),  # another release
        msgpack.packb([WIRE_VERSION, 99, "k"]),  # an unknown kind
        msgpack.packb([WIRE_VERSION, kind_of(Discard)]),  # a field missing
        msgpack.packb([WIRE_VERSION, kind_of(Discard), 7]),  # a key that is not a string
        msgpack.packb([WIRE_VERSION, kind_of(Take), 1, ["r"], [], None, "s", None, False]),  # a bad request
        msgpack.packb(7),
        msgpack.packb([WIRE_VERSION, kind_of(Reply), 1, 1, None]),  # an int where a bool goes
        encode_other(Abort("r")),  # the intake's message
    ],
)
def test_a_malformed_message_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


async def _alive() -> bool:
    return True


class _Worker:
    """What the worker actor's ``_handed`` does with each message, recorded."""

    def __init__(self) -> None:
        self.got: list[HandoffMessage] = []

    def handle(self, message: HandoffMessage) -> Any:
        self.got.append(message)
        if isinstance(message, Take):
            return self._take(message)
        return None

    async def _take(self, message: Take) -> bool:
        if message.subscriber == "raises":
            raise RuntimeError("the worker's take failed")
        await asyncio.sleep(0.01)
        return message.request.request_id != "refused"


def test_takes_are_answered_and_every_message_arrives_in_the_order_sent() -> None:
    async def main() -> None:
        server, worker = HandoffServer("127.0.0.1"), _Worker()
        serving = asyncio.ensure_future(server.serve(worker.handle))
        link = HandoffLink(server.address, server.token, "prefill-0", _alive)
        link.send(PullKV("shm://p", "r1#2"))
        taken = await link.take(REQ, (8,), EST, "fd", None)
        refused = await link.take(Request("refused", (1,), SamplingSpec(max_tokens=2)), (3,), None, "fd")
        both = await asyncio.gather(link.take(REQ, (), None, "fd"), link.take(REQ, (), EST, "fd", None, True))
        link.send(Refine("r1", 2, EST))
        await until(lambda: len(worker.got) == 6)
        assert (taken, refused, both) == (True, False, [True, True])
        assert worker.got[0] == PullKV("shm://p", "r1#2") and worker.got[1] == Take(1, REQ, (8,), EST, "fd", None)
        assert worker.got[-1] == Refine("r1", 2, EST)  # after the takes it follows
        with pytest.raises(HandoffError, match="the worker's take failed"):
            await link.take(REQ, (), None, "raises")
        assert await link.take(REQ, (), None, "fd")  # the channel goes on
        link.close()
        with pytest.raises(HandoffError):  # a closed link takes nothing
            await link.take(REQ, (), None, "fd")
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_a_peer_without_the_token_is_not_heard() -> None:
    async def main() -> None:
        server, worker = HandoffServer("127.0.0.1"), _Worker()
        serving = asyncio.ensure_future(server.serve(worker.handle))
        stranger = HandoffLink(server.address, b"0" * 32, "prefill-9", _alive)
        stranger.send(Discard("k0"))
        link = HandoffLink(server.address, server.token, "prefill-0", _alive)
        link.send(Discard("k1"))
        await until(lambda: worker.got == [Discard("k1")])
        await asyncio.sleep(0.05)
        assert worker.got == [Discard("k1")]
        stranger.close()
        link.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


class _Died(Exception):
    """Stands in for Ray's ActorDiedError."""


def test_a_take_on_a_dead_decode_worker_fails_with_the_probe_error_and_so_does_every_later_one() -> None:
    async def main() -> None:
        server = HandoffServer("127.0.0.1")  # bound, never served: the worker hangs, or is gone
        probes: list[float] = []

        async def probe() -> bool:
            probes.append(time.monotonic())
            if len(probes) >= 2:
                raise _Died("the actor is dead")
            return True

        link = HandoffLink(server.address, server.token, "prefill-0", probe)
        t0 = time.monotonic()
        with pytest.raises(_Died):
            await link.take(REQ, (), None, "fd")
        assert len(probes) == 2 and time.monotonic() - t0 < 3.0
        with pytest.raises(_Died):
            await link.take(REQ, (), None, "fd")

    asyncio.run(main())


def test_a_message_of_several_frames_is_dropped_and_a_living_worker_that_does_not_answer_fails_the_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tetriserve.common.handoff_channel as channel

    monkeypatch.setattr(channel, "LIVENESS_S", 0.05)
    monkeypatch.setattr(channel, "ANSWER_TIMEOUT_S", 0.3)

    async def main() -> None:
        server, worker = HandoffServer("127.0.0.1"), _Worker()
        serving = asyncio.ensure_future(server.serve(worker.handle))
        link = HandoffLink(server.address, server.token, "prefill-0", _alive)
        link._socket.send_multipart([encode(Discard("k0")), b"more"])  # what a broken sender might put on the wire
        assert await link.take(REQ, (), None, "fd")  # the server goes on
        assert worker.got == [Take(1, REQ, (), None, "fd")]
        serving.cancel()  # the worker lives (its probe answers) but its server is gone
        await asyncio.gather(serving, return_exceptions=True)
        t0 = time.monotonic()
        with pytest.raises(HandoffError, match="did not answer"):
            await link.take(REQ, (), None, "fd")
        assert 0.25 < time.monotonic() - t0 < 2.0
        link.close()

    asyncio.run(main())


class _Method:
    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]], name: str, result: Any = None) -> None:
        self.calls, self.name, self.result = calls, name, result

    def remote(self, *args: Any) -> Any:
        self.calls.append((self.name, args))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(self.result, Exception):
            future.set_exception(self.result)
        else:
            future.set_result(self.result)
        return future


class _Handle:
    """A decode worker's Ray handle, recording calls; ``handoff_address`` answers ``address`` (or raises it)."""

    def __init__(self, address: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.handoff_address = _Method(self.calls, "handoff_address", address)
        self.take = _Method(self.calls, "take", True)
        self.ping = _Method(self.calls, "ping", True)
        for name in ("pull_kv", "refine", "discard", "kv_failed"):
            setattr(self, name, _Method(self.calls, name))


def test_a_decode_peer_uses_ray_until_its_link_is_up_and_for_a_worker_without_a_server() -> None:
    async def main() -> None:
        old = _Handle(AttributeError("no handoff_address"))  # a worker of a release without the server
        peer = DecodePeer("decode-0", old, "prefill-0")
        assert await peer.take(REQ, (8,), EST, "fd")  # over Ray, and it asks for the server
        await asyncio.sleep(0.01)
        peer.pull_kv("shm://p", "k")
        peer.discard("k")
        assert peer.link is None
        assert [name for name, _ in old.calls] == ["take", "handoff_address", "pull_kv", "discard"]

        server, worker = HandoffServer("127.0.0.1"), _Worker()
        serving = asyncio.ensure_future(server.serve(worker.handle))
        new = _Handle((server.address, server.token.decode()))
        peer = DecodePeer("decode-1", new, "prefill-0")
        peer.discard("k0")  # the first call goes over Ray, and starts the link
        await until(lambda: peer.link is not None)
        peer.pull_kv("shm://p", "k")
        assert await peer.take(REQ, (8,), EST, "fd")
        peer.refine("r1", 2, EST)
        peer.kv_failed("k", "lost")
        await until(lambda: len(worker.got) == 4)
        assert [type(m) for m in worker.got] == [PullKV, Take, Refine, KvFailed]
        assert [name for name, _ in new.calls] == ["discard", "handoff_address"]  # the rest went over the link
        peer.close()  # that life is over: what still comes goes over Ray (raising as a dead actor's call would)
        assert await peer.take(REQ, (8,), EST, "fd")
        assert [name for name, _ in new.calls][-1] == "take"
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())
