"""Waiting in async tests for what another task or process does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(cond: Callable[[], object], timeout: float = 5.0) -> None:
    """Return once ``cond()`` is true, looking every 5 ms; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
