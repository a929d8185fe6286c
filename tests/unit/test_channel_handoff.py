"""A prefill worker's handoff calls on a decode worker (channel/handoff.py): the messages, the worker methods they
call, and the decode peer that connects a link on first use (prefill_worker/decode_peers.py)."""

from __future__ import annotations

import asyncio
import inspect
import typing
from dataclasses import fields, replace
from typing import Any

import msgpack
import pytest

from tests.waiting import until
from tetriserve.channel import core
from tetriserve.channel.core import WIRE_VERSION, kind_of
from tetriserve.channel.handoff import HANDOFF_MESSAGES, Discard, HandoffMessage, KvFailed, PullKV, Refine, Take
from tetriserve.channel.intake import Abort
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.prefill_worker.decode_peers import DecodePeer
from tetriserve.worker.actor import Worker

REQ = Request("r1", (5, 6, 7), SamplingSpec(max_tokens=9, temperature=0.5, stop=("x",)), attempt=2, resume=(4,))
EST = LengthEstimate(10, 15, 20, bucket=1, confidence=0.5, source="test")
REQ_EST = replace(REQ, length_estimate=EST)  # the estimate travels on the request


def decode(data: bytes) -> HandoffMessage:
    message: HandoffMessage = core.decode(data, HANDOFF_MESSAGES)
    return message


@pytest.mark.parametrize(
    "message",
    [
        Take(REQ_EST, (8,), "frontdoor-1", "tcp://10.0.0.1:5", False),
        Take(REQ, (), "frontdoor-1", None, True),
        PullKV("shm://prefill-0", "r1#2"),
        Refine("r1", 2, EST),
        Discard("r1#2"),
        KvFailed("r1#2", "send failed"),
    ],
)
def test_every_message_comes_back_as_it_was_sent(message: HandoffMessage) -> None:
    assert decode(core.encode(message, call=3)) == message


@pytest.mark.parametrize(
    "data",
    [
        b"\x00not msgpack",
        msgpack.packb([WIRE_VERSION + 1, kind_of(Discard), 0, "k"]),  # another release
        msgpack.packb([WIRE_VERSION, 99, 0, "k"]),  # an unknown kind
        msgpack.packb([WIRE_VERSION, kind_of(Discard), 0]),  # a field missing
        msgpack.packb([WIRE_VERSION, kind_of(Discard), 0, 7]),  # a key that is not a string
        msgpack.packb([WIRE_VERSION, kind_of(Take), 1, ["r"], [], "s", None, False]),  # a bad request
        msgpack.packb(7),
        core.encode(Abort("r")),  # the intake's message
    ],
)
def test_a_malformed_message_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


@pytest.mark.parametrize("message_type", HANDOFF_MESSAGES)
def test_each_message_calls_the_worker_method_of_its_name_with_its_fields_in_order(message_type: type) -> None:
    call = core._BY_CLASS[message_type].call
    assert call is not None
    method = getattr(Worker, call)
    params = list(inspect.signature(method).parameters.values())[1:]
    hints = typing.get_type_hints(method)
    assert [p.name for p in params] == [f.name for f in fields(message_type)]
    assert [hints[p.name] for p in params] == [
        typing.get_type_hints(message_type)[f.name] for f in fields(message_type)
    ]


async def _alive() -> bool:
    return True


class _Worker:
    """The decode worker's methods the handoff calls, recorded."""

    def __init__(self) -> None:
        self.got: list[HandoffMessage] = []

    def handle(self, message: HandoffMessage) -> Any:
        self.got.append(message)
        return core.invoke(self, message)

    async def take(self, request: Request, *rest: object) -> bool:
        await asyncio.sleep(0.01)
        return request.request_id != "refused"

    async def refine(self, *fields: object) -> bool:
        return True

    def pull_kv(self, *fields: object) -> None:
        return None

    discard = kv_failed = pull_kv


class _Method:
    def __init__(self, calls: list[str], name: str, result: Any = None) -> None:
        self.calls, self.name, self.result = calls, name, result

    def remote(self, *args: Any) -> Any:
        self.calls.append(self.name)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(self.result, Exception):
            future.set_exception(self.result)
        else:
            future.set_result(self.result)
        return future


class _Died(Exception):
    """Stands in for Ray's ActorDiedError."""


class _Handle:
    """A decode worker's Ray handle: ``handoff_address`` answers ``address`` (or raises it), ``ping`` ``alive``."""

    def __init__(self, address: Any, alive: Any = True) -> None:
        self.calls: list[str] = []
        self.handoff_address = _Method(self.calls, "handoff_address", address)
        self.ping = _Method(self.calls, "ping", alive)


def _serve() -> tuple[core.Endpoint, _Worker, asyncio.Future[None]]:
    endpoint, worker = core.Endpoint("127.0.0.1", "handoff", HANDOFF_MESSAGES, b"tok"), _Worker()
    return endpoint, worker, asyncio.ensure_future(endpoint.serve(worker.handle))


def test_a_decode_peer_connects_on_first_use_and_what_was_sent_meanwhile_goes_first_in_order() -> None:
    async def main() -> None:
        endpoint, worker, serving = _serve()
        handle = _Handle((endpoint.address, "tok"))
        peer = DecodePeer("decode-1", handle, "prefill-0")
        peer.send(PullKV("shm://p", "k"))  # before the link is up: it waits, in order
        peer.send(Discard("k0"))
        assert await peer.take(Take(REQ_EST, (8,), "fd"))
        assert not await peer.take(Take(Request("refused", (1,), SamplingSpec()), (), "fd"))
        peer.send(Refine("r1", 2, EST))
        peer.send(KvFailed("k", "lost"))
        await until(lambda: len(worker.got) == 6)
        assert [type(m) for m in worker.got] == [PullKV, Discard, Take, Take, Refine, KvFailed]
        assert handle.calls == ["handoff_address"]  # one Ray call; everything else over the link
        peer.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_a_decode_peer_dead_before_its_link_is_up_fails_a_take_as_ray_would_and_drops_its_messages() -> None:
    from ray.exceptions import ActorDiedError

    async def main() -> None:
        handle = _Handle(ActorDiedError())
        peer = DecodePeer("decode-0", handle, "prefill-0")
        peer.send(Discard("k"))
        with pytest.raises(ActorDiedError):
            await peer.take(Take(REQ, (), "fd"))
        peer.send(Discard("k2"))  # dropped, no error
        with pytest.raises(ActorDiedError):
            await peer.take(Take(REQ, (), "fd"))
        assert peer._pending == [] and handle.calls == ["handoff_address"]  # a dead life is not asked again

    asyncio.run(main())


def test_a_decode_peer_whose_address_call_failed_otherwise_asks_again_and_keeps_its_messages() -> None:
    async def main() -> None:
        endpoint, worker, serving = _serve()
        handle = _Handle(RuntimeError("not yet"))
        peer = DecodePeer("decode-1", handle, "prefill-0")
        peer.send(Discard("k0"))
        with pytest.raises(RuntimeError, match="not yet"):
            await peer.take(Take(REQ, (), "fd"))
        handle.handoff_address.result = (endpoint.address, "tok")  # it answers now
        assert await peer.take(Take(REQ, (), "fd"))
        await until(lambda: len(worker.got) == 2)
        assert [type(m) for m in worker.got] == [Discard, Take] and handle.calls.count("handoff_address") == 2
        peer.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_a_closed_decode_peer_answers_a_take_with_the_actors_death() -> None:
    async def main() -> None:
        endpoint, worker, serving = _serve()
        handle = _Handle((endpoint.address, "tok"), alive=_Died("gone"))
        peer = DecodePeer("decode-1", handle, "prefill-0")
        peer.send(Discard("k0"))
        await until(lambda: len(worker.got) == 1)
        peer.close()  # that life is over
        with pytest.raises(_Died):
            await peer.take(Take(REQ, (), "fd"))
        assert worker.got == [Discard("k0")]
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())
