"""The front door's intake to a worker (channel/intake.py): its messages on the wire."""

from __future__ import annotations

import msgpack
import pytest

from tetriserve.channel.core import WIRE_VERSION, encode, kind_of
from tetriserve.channel.core import decode as decode_any
from tetriserve.channel.handoff import Discard
from tetriserve.channel.intake import INTAKE_MESSAGES, Abort, IntakeMessage, Submit
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestState, SamplingSpec

ABORT, SUBMIT = kind_of(Abort), kind_of(Submit)


def decode(data: bytes) -> IntakeMessage:
    message: IntakeMessage = decode_any(data, INTAKE_MESSAGES)
    return message


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
        msgpack.packb([WIRE_VERSION + 1, ABORT, 0, "r", 0]),  # another version
        msgpack.packb([WIRE_VERSION, 99, 0, "r", 0]),  # an unknown kind
        msgpack.packb([WIRE_VERSION, ABORT, 0, 5, 0]),  # a request id that is not a string
        msgpack.packb([WIRE_VERSION, SUBMIT, 0, ["r"]]),  # a request without its fields
        msgpack.packb(
            [
                WIRE_VERSION,
                SUBMIT,
                0,
                ["r", [], {}, [None, None, None], 0, 0.0, None, None, None, None, [], 0, [], None],
            ]
        ),  # an empty prompt
        msgpack.packb(
            [
                WIRE_VERSION,
                SUBMIT,
                0,
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
