"""The messaging layer (channel/core.py): a message is its dataclass, registered once, every field checked; the
endpoint and the link carry one-way messages in order, calls with their answers, and a peer's death."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from tests.waiting import until
from tetriserve.channel import core
from tetriserve.common.length import LengthEstimate


@core.message(901, call="probe")
@dataclass(frozen=True)
class _Probe:
    name: str
    count: int
    ratio: float
    flag: bool
    tokens: tuple[int, ...]
    estimate: LengthEstimate | None = None
    note: str | None = None


@core.message(902, call="ask")
@dataclass(frozen=True)
class _Ask:
    what: str


V = core.WIRE_VERSION


def test_a_new_message_needs_nothing_but_its_dataclass() -> None:
    message = _Probe("a", 3, 0.5, True, (1, 2), LengthEstimate(1, 2, 3), None)
    assert core.decode(core.encode(message), (_Probe,)) == message
    assert core.decode(core.encode(_Probe("b", 0, 2, False, ())), (_Probe,)) == _Probe("b", 0, 2, False, ())


def test_a_kind_is_registered_once_and_kind_zero_is_the_reply() -> None:
    with pytest.raises(ValueError, match="taken by _Probe"):

        @core.message(901)
        @dataclass(frozen=True)
        class _Other:
            x: int

    with pytest.raises(ValueError, match="not a message kind"):

        @core.message(core.REPLY)
        @dataclass(frozen=True)
        class _Reply:
            x: int


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ([V + 1, 901, 0, "a", 1, 0.5, True, [], None, None], "wire version"),
        ([V, 903, 0, "a"], "unknown message kind 903"),
        ([V, 901, 0, "a", 1], "has 7 fields, this one 2"),
        ([V, 901, 0, 5, 1, 0.5, True, [], None, None], "_Probe.name"),
        ([V, 901, 0, "a", True, 0.5, True, [], None, None], "_Probe.count"),  # a bool is no count
        ([V, 901, 0, "a", 1, 0.5, 1, [], None, None], "_Probe.flag"),  # nor an int a flag
        ([V, 901, 0, "a", 1, 0.5, True, [1, "x"], None, None], "_Probe.tokens"),
        ([V, 901, 0, "a", 1, 0.5, True, [], {"lower": 1}, None], "_Probe.estimate"),
        ([V, 901, -1, "a", 1, 0.5, True, [], None, None], "call id"),
        ([V, 901, "c", "a", 1, 0.5, True, [], None, None], "call id"),
        ([V, core.REPLY, 3, True, None], "a reply where a message was expected"),
        ([V, core.REPLY, 0, True, None], "malformed reply"),  # a reply answers a call
        ([V, core.REPLY, 3, True, 5], "malformed reply"),
        ("not a frame", "not \\[version, kind, call"),
    ],
)
def test_every_field_is_checked_and_a_bad_frame_is_a_value_error(frame: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        core.decode(msgpack.packb(frame), (_Probe,))


def test_a_socket_takes_only_its_own_kinds() -> None:
    with pytest.raises(ValueError, match="unknown message kind 901"):
        core.decode(core.encode(_Probe("a", 1, 0.5, True, ())), (_Ask,))


def test_a_message_calls_the_method_it_names_with_its_fields() -> None:
    class Target:
        def ask(self, what: str) -> str:
            return what.upper()

    assert core.invoke(Target(), _Ask("hi")) == "HI"


async def _alive() -> bool:
    return True


class _Receiver:
    """An endpoint's handler: records every message; ``ask`` answers (after a moment), or raises for "raises"."""

    def __init__(self) -> None:
        self.got: list[object] = []

    def handle(self, message: object) -> Any:
        self.got.append(message)
        return core.invoke(self, message)

    def probe(self, *fields: object) -> None:
        return None

    async def ask(self, what: str) -> str:
        if what == "raises":
            raise RuntimeError("the receiver's method failed")
        await asyncio.sleep(0.01)
        return what * 2


def _serve(token: bytes | None = b"t" * 8) -> tuple[core.Endpoint, _Receiver, asyncio.Future[None]]:
    endpoint, receiver = core.Endpoint("127.0.0.1", "test", (_Probe, _Ask), token), _Receiver()
    return endpoint, receiver, asyncio.ensure_future(endpoint.serve(receiver.handle))


async def _stop(serving: asyncio.Future[None]) -> None:
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)


def _probe(name: str) -> _Probe:
    return _Probe(name, 1, 0.5, True, ())


def test_calls_are_answered_and_every_message_arrives_in_the_order_sent() -> None:
    async def main() -> None:
        endpoint, receiver, serving = _serve()
        link = core.Link(endpoint.address, b"t" * 8 + b":caller", "test link", _alive)
        link.send(_probe("first"))
        assert await link.call(_Ask("a")) == "aa"
        assert await asyncio.gather(link.call(_Ask("b")), link.call(_Ask("c"))) == ["bb", "cc"]
        link.send(_probe("last"))
        await until(lambda: len(receiver.got) == 5)
        assert receiver.got[0] == _probe("first") and receiver.got[1] == _Ask("a")
        assert receiver.got[-1] == _probe("last")
        with pytest.raises(core.PeerError, match="the receiver's method failed"):
            await link.call(_Ask("raises"))
        assert await link.call(_Ask("d")) == "dd"  # the channel goes on
        link.close()
        with pytest.raises(core.PeerError, match="closed"):  # a closed link calls nothing
            await link.call(_Ask("e"))
        await _stop(serving)

    asyncio.run(main())


def test_a_peer_without_the_token_is_not_heard() -> None:
    async def main() -> None:
        endpoint, receiver, serving = _serve()
        stranger = core.Link(endpoint.address, b"0" * 8 + b":x", "stranger")
        stranger.send(_probe("k0"))
        link = core.Link(endpoint.address, b"t" * 8 + b":y", "link")
        link.send(_probe("k1"))
        await until(lambda: receiver.got == [_probe("k1")])
        await asyncio.sleep(0.05)
        assert receiver.got == [_probe("k1")]
        stranger.close()
        link.close()
        await _stop(serving)

    asyncio.run(main())


class _Died(Exception):
    """Stands in for Ray's ActorDiedError."""


def test_a_call_on_a_dead_peer_fails_with_the_probe_error_and_so_does_every_later_one() -> None:
    async def main() -> None:
        endpoint = core.Endpoint("127.0.0.1", "test", (_Ask,))  # bound, never served: the peer hangs, or is gone
        probes: list[float] = []

        async def probe() -> bool:
            probes.append(time.monotonic())
            if len(probes) >= 2:
                raise _Died("the actor is dead")
            return True

        link = core.Link(endpoint.address, b"r", "link", probe)
        t0 = time.monotonic()
        with pytest.raises(_Died):
            await link.call(_Ask("a"))
        assert len(probes) == 2 and time.monotonic() - t0 < 3.0
        with pytest.raises(_Died):
            await link.call(_Ask("a"))
        endpoint.close()

    asyncio.run(main())


def test_a_call_on_a_closed_link_asks_whether_the_peer_lives_first() -> None:
    async def dead() -> None:
        raise _Died("gone")

    async def main() -> None:
        endpoint = core.Endpoint("127.0.0.1", "test", (_Ask,))
        link = core.Link(endpoint.address, b"r", "link", dead)
        link.close()
        with pytest.raises(_Died):  # its death, as a Ray call on it would raise
            await link.call(_Ask("a"))
        endpoint.close()

    asyncio.run(main())


def test_a_message_of_several_frames_is_dropped_and_a_living_peer_that_does_not_answer_fails_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "LIVENESS_S", 0.05)
    monkeypatch.setattr(core, "ANSWER_TIMEOUT_S", 0.3)

    async def main() -> None:
        endpoint, receiver, serving = _serve(None)
        link = core.Link(endpoint.address, b"r", "link", _alive)
        link._socket.send_multipart([core.encode(_probe("k0")), b"more"])  # what a broken sender might send
        assert await link.call(_Ask("a")) == "aa"  # the endpoint goes on
        assert receiver.got == [_Ask("a")]
        await _stop(serving)  # the peer lives (its probe answers) but its endpoint is gone
        t0 = time.monotonic()
        with pytest.raises(core.PeerError, match="did not answer"):
            await link.call(_Ask("b"))
        assert 0.25 < time.monotonic() - t0 < 2.0
        link.close()

    asyncio.run(main())


def test_an_endpoint_reaches_the_link_connected_under_a_routing_id_and_none_other() -> None:
    async def main() -> None:
        endpoint = core.Endpoint("127.0.0.1", "test")
        got: list[object] = []
        route, other = b"prefill-0/aa", b"prefill-0/bb"
        assert not endpoint.send(route, _Ask("x"))  # nobody connected yet: the caller learns it at once
        link = core.Link(endpoint.address, route, "link", accepts=(_Ask,), on_message=got.append)
        await until(lambda: endpoint.send(route, _Ask("first")))  # once it is connected
        assert endpoint.send(route, _probe("not taken here")) and endpoint.send(route, _Ask("then"))
        assert not endpoint.send(other, _Ask("x"))  # a routing id nobody connected under
        await until(lambda: len(got) == 2)
        assert got == [_Ask("first"), _Ask("then")]  # in the order sent; a kind it does not take dropped
        link.close()
        await until(lambda: not endpoint.send(route, _Ask("late")))  # gone: the sender learns it
        endpoint.close()

    asyncio.run(main())


def test_a_bad_message_or_a_failing_handler_does_not_close_the_link() -> None:
    async def main() -> None:
        endpoint = core.Endpoint("127.0.0.1", "test")
        got: list[object] = []

        def deliver(message: object) -> None:
            if message == _Ask("boom"):
                raise RuntimeError("the handler failed")
            got.append(message)

        route = b"decode-0/cc"
        link = core.Link(endpoint.address, route, "link", accepts=(_Ask,), on_message=deliver)
        await until(lambda: endpoint.send(route, _Ask("boom")))
        endpoint._socket.send_multipart([route, b"\x00not msgpack"])  # what a broken sender might send
        endpoint.send(route, _Ask("after"))
        await until(lambda: got == [_Ask("after")])
        link.close()
        endpoint.close()

    asyncio.run(main())


def test_a_sender_from_a_thread_without_a_loop_reaches_the_endpoint_in_order() -> None:
    async def main() -> None:
        endpoint, receiver, serving = _serve(None)
        sender = core.Sender(endpoint.address)
        await asyncio.to_thread(lambda: [sender.send(_probe(str(i))) for i in range(50)])
        await until(lambda: len(receiver.got) == 50)
        assert receiver.got == [_probe(str(i)) for i in range(50)]
        sender.close()
        await _stop(serving)

    asyncio.run(main())
