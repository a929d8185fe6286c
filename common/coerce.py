"""Numbers out of decoded data (JSON, msgpack): ``int(value)`` and ``float(value)`` for a value of unknown type.

Each takes what the builtin takes (a number, a numeric string or bytes, an object with ``__int__`` /
``__float__`` / ``__index__``) and raises the builtin's TypeError for anything else, so a caller's handling of
malformed data stays as it is."""

from __future__ import annotations

from typing import SupportsFloat, SupportsIndex, SupportsInt


def as_int(value: object) -> int:
    """``int(value)``."""
    if isinstance(value, str | bytes | bytearray | SupportsInt | SupportsIndex):
        return int(value)
    raise TypeError(f"int() argument must be a string, a bytes-like object or a real number, not {_name(value)}")


def as_float(value: object) -> float:
    """``float(value)``."""
    if isinstance(value, str | bytes | bytearray | SupportsFloat | SupportsIndex):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not {_name(value)}")


def _name(value: object) -> str:
    return f"'{type(value).__name__}'"
