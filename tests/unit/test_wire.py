"""The wire codec (common/wire.py): a message is its dataclass, registered once; every field is checked."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest

from tetriserve.common import wire
from tetriserve.common.length import LengthEstimate


@wire.wire_message(901)
@dataclass(frozen=True)
class _Probe:
    name: str
    count: int
    ratio: float
    flag: bool
    tokens: tuple[int, ...]
    estimate: LengthEstimate | None = None
    note: str | None = None


def test_a_new_message_needs_nothing_but_its_dataclass() -> None:
    message = _Probe("a", 3, 0.5, True, (1, 2), LengthEstimate(1, 2, 3), None)
    assert wire.decode(wire.encode(message), (_Probe,)) == message
    assert wire.decode(wire.encode(_Probe("b", 0, 2, False, ())), (_Probe,)) == _Probe("b", 0, 2, False, ())


def test_a_kind_is_registered_once() -> None:
    with pytest.raises(ValueError, match="taken by _Probe"):

        @wire.wire_message(901)
        @dataclass(frozen=True)
        class _Other:
            x: int


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ([wire.WIRE_VERSION + 1, 901, "a", 1, 0.5, True, [], None, None], "wire version"),
        ([wire.WIRE_VERSION, 902, "a"], "unknown message kind 902"),
        ([wire.WIRE_VERSION, 901, "a", 1], "has 7 fields, this one 2"),
        ([wire.WIRE_VERSION, 901, 5, 1, 0.5, True, [], None, None], "_Probe.name"),
        ([wire.WIRE_VERSION, 901, "a", True, 0.5, True, [], None, None], "_Probe.count"),  # a bool is no count
        ([wire.WIRE_VERSION, 901, "a", 1, 0.5, 1, [], None, None], "_Probe.flag"),  # nor an int a flag
        ([wire.WIRE_VERSION, 901, "a", 1, 0.5, True, [1, "x"], None, None], "_Probe.tokens"),
        ([wire.WIRE_VERSION, 901, "a", 1, 0.5, True, [], {"lower": 1}, None], "_Probe.estimate"),
        ("not a frame", "not \\[version, kind"),
    ],
)
def test_every_field_is_checked_and_a_bad_frame_is_a_value_error(frame: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wire.decode(msgpack.packb(frame), (_Probe,))


def test_a_channel_takes_only_its_own_kinds() -> None:
    with pytest.raises(ValueError, match="unknown message kind 901"):
        wire.decode(wire.encode(_Probe("a", 1, 0.5, True, ())), ())
