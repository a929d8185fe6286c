"""Helpers for the transport tests: poll with a deadline, receive with a deadline, unique endpoint names."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from tetriserve.transport.api import Transport

_T = TypeVar("_T")
_names = itertools.count()


def poll(fn: Callable[[], _T | None], timeout: float = 10.0, what: str = "condition") -> _T:
    """Call ``fn`` until it returns something other than None/False, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.001)


def recv_within(t: Transport, key: str, timeout: float = 10.0) -> list[bytearray]:
    return poll(lambda: t.recv(key), timeout, f"key {key!r} to land on {t.address}")


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns()}"
