"""The front door's intake to a worker over ZeroMQ (common/intake.py): the wire, and the channel."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from tests.waiting import until
from tetriserve.common.handoff_channel import Discard
from tetriserve.common.intake import (
    Abort,
    IntakeMessage,
    IntakeRouter,
    Submit,
    decode,
    encode,
    serve_intake,
)
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestState, SamplingSpec
from tetriserve.common.wire import WIRE_VERSION, kind_of

ABORT, SUBMIT = kind_of(Abort), kind_of(Submit)


def _full_request() -> Request:
    sampling = SamplingSpec(
        max_tokens=40,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        seed=11,
        stop_token_ids=(2, 3),
        ignore_eos=True,
        min_tokens=4,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
        stop=("END", "\n\n"),
        logprobs=3,
        min_p=0.05,
        logit_bias=((7, 2.5), (9, -100.0)),
        allowed_token_ids=(7, 8, 9),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    req = Request(
        "req-é-1",
        (1, 5, 9, 200),
        sampling,
        SLO(ttft_ms=500.0, tbt_ms=50.0),
        priority=2,
        arrival_time=1234.5,
        length_estimate=LengthEstimate(10, 20, 30, bucket=1, confidence=0.5, source="trained"),
        prefill_worker="prefill-1",
        attempt=2,
        resume=(4, 4, 6),
        trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    req.advance(RequestState.PREFILLING, "prefill-1", at=1235.0)
    return req


def test_a_submit_carries_every_field_of_the_request() -> None:
    req = _full_request()
    got = decode(encode(Submit(req)))
    assert isinstance(got, Submit)
    assert got.request == req  # every field, the sampling spec's tuples (logit_bias pairs) and the events included
    assert isinstance(got.request.sampling.logit_bias[0], tuple) and isinstance(got.request.prompt_token_ids, tuple)


def test_a_plain_request_and_an_abort_round_trip() -> None:
    req = Request("r", (1,), SamplingSpec())
    assert decode(encode(Submit(req))) == Submit(req)
    assert decode(encode(Abort("r", 3))) == Abort("r", 3)
    assert decode(encode(Abort("r"))) == Abort("r", None)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00garbage",
        msgpack.packb([WIRE_VERSION + 1, ABORT, "r", 0]),  # another version
        msgpack.packb([WIRE_VERSION, 99, "r", 0]),  # an unknown kind
        msgpack.packb([WIRE_VERSION, ABORT, 5, 0]),  # a request id that is not a string
        msgpack.packb([WIRE_VERSION, SUBMIT, ["r"]]),  # a request without its fields
        msgpack.packb(
            [
                WIRE_VERSION,
                SUBMIT,
                ["r", [], {}, [None, None, None], 0, 0.0, None, None, None, None, [], 0, [], None],
            ]
        ),  # an empty prompt
        msgpack.packb(
            [
                WIRE_VERSION,
                SUBMIT,
                ["r", [1], {"max_tokens": 0}, [None, None, None], 0, 0.0, None, None, None, None, [], 0, [], None],
            ]
        ),  # max_tokens 0
        msgpack.packb(7),
        encode(Discard("k")),  # the handoff channel's message
    ],
)
def test_a_malformed_message_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


def test_messages_reach_the_worker_attached_under_the_routing_id_and_none_other() -> None:
    async def main() -> None:
        router = IntakeRouter("127.0.0.1")
        got: list[IntakeMessage] = []
        route, other = b"prefill-0/aa", b"prefill-0/bb"
        assert not router.send(route, Abort("x"))  # nobody attached yet: the caller uses Ray
        reader = asyncio.ensure_future(serve_intake(router.address, route, got.append))
        await until(lambda: router.send(route, Abort("first", 0)))  # once it is connected
        req = Request("r", (1, 2), SamplingSpec(max_tokens=3))
        assert router.send(route, Submit(req)) and router.send(route, Abort("r", 0))
        assert not router.send(other, Abort("r"))  # a routing id no worker attached under
        await until(lambda: len(got) == 3)
        assert got == [Abort("first", 0), Submit(req), Abort("r", 0)]  # in the order sent
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await until(lambda: not router.send(route, Abort("late")))  # detached: the sender learns it
        router.close()

    asyncio.run(main())


def test_a_bad_message_or_a_failing_delivery_does_not_close_the_channel() -> None:
    async def main() -> None:
        router = IntakeRouter("127.0.0.1")
        got: list[IntakeMessage] = []

        def deliver(message: IntakeMessage) -> None:
            if message == Abort("boom"):
                raise RuntimeError("the worker's handler failed")
            got.append(message)

        route = b"decode-0/cc"
        reader = asyncio.ensure_future(serve_intake(router.address, route, deliver))
        await until(lambda: router.send(route, Abort("boom")))
        router._socket.send_multipart([route, b"\x00not msgpack"])  # what a broken sender might put on the wire
        router.send(route, Abort("after", 1))
        await until(lambda: got == [Abort("after", 1)])
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        router.close()

    asyncio.run(main())
