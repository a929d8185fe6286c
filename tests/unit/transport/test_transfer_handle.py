"""A transfer's handle tells whoever waits on it that it is over (transport/api.py): a callback runs once, on the
thread that ends the transfer or at once if it is over already, and an event loop awaits it without polling."""

from __future__ import annotations

import asyncio
import threading
import time

from tetriserve.transport.api import TransferHandle, TransferState


def test_a_callback_runs_once_when_the_transfer_ends_or_at_once_if_it_has() -> None:
    handle = TransferHandle("k", 0)
    calls: list[str] = []
    handle.on_done(lambda: calls.append(threading.current_thread().name))
    assert calls == []
    ender = threading.Thread(target=handle.complete, name="io")
    ender.start()
    ender.join()
    assert calls == ["io"] and handle.state is TransferState.DONE
    handle.on_done(lambda: calls.append("late"))
    assert calls == ["io", "late"]
    failed = TransferHandle.refused("k2", "closed")
    failed.on_done(lambda: calls.append(failed.state.value))
    assert calls[-1] == "failed"


def test_an_event_loop_is_woken_by_the_ending_thread_and_gives_up_at_its_timeout() -> None:
    async def scenario() -> tuple[float, TransferState, float, TransferState, TransferState]:
        handle = TransferHandle("k", 0)
        threading.Timer(0.05, handle.complete).start()
        started = time.monotonic()
        state = await handle.settled(5.0)
        woken_after = time.monotonic() - started
        stuck = TransferHandle("never", 0)
        started = time.monotonic()
        pending = await stuck.settled(0.05)
        gave_up_after = time.monotonic() - started
        return woken_after, state, gave_up_after, pending, await handle.settled(0.0)

    woken_after, state, gave_up_after, pending, again = asyncio.run(scenario())
    assert state is TransferState.DONE and woken_after < 2.0  # woken, not timed out
    assert pending is TransferState.PENDING and 0.04 <= gave_up_after < 2.0
    assert again is TransferState.DONE  # over already: no wait


def test_a_failing_callback_is_logged_and_neither_stops_the_others_nor_the_ending_thread() -> None:
    handle = TransferHandle("k", 0)
    calls: list[int] = []

    def broken() -> None:
        raise RuntimeError("event loop is closed")

    handle.on_done(broken)
    handle.on_done(lambda: calls.append(1))
    handle.complete()  # does not raise
    assert calls == [1] and handle.state is TransferState.DONE
