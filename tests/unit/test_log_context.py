"""``common/log_context.py``: the request id (and trace id) on the log lines of a request's path, with many
requests sharing one event loop, in callbacks from another thread, and in the log format."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from tetriserve.common import log_context

TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


@pytest.fixture(autouse=True)
def installed() -> None:
    log_context.install()
    log_context.bind(None)


def _record(message: str = "m") -> logging.LogRecord:
    return logging.getLogger("tetriserve.test").makeRecord(
        "tetriserve.test", logging.INFO, __file__, 1, message, (), None
    )


def test_outside_a_request_lines_carry_no_tag() -> None:
    record = _record()
    assert (record.request_id, record.trace_id, record.request_tag) == ("-", "-", "")  # type: ignore[attr-defined]
    line = logging.Formatter(log_context.FORMAT).format(record)
    assert line.endswith(" INFO tetriserve.test: m")


def test_a_bound_request_shows_its_id_and_trace_id() -> None:
    with log_context.bound("r1", TRACEPARENT):
        record = _record()
    assert record.request_id == "r1" and record.trace_id == "a" * 32  # type: ignore[attr-defined]
    line = logging.Formatter(log_context.FORMAT).format(record)
    assert line.endswith(f" INFO tetriserve.test [req=r1 trace={'a' * 32}]: m")
    with log_context.bound("r2"):
        assert _record().request_tag == " [req=r2]"  # type: ignore[attr-defined]
    assert _record().request_tag == ""  # type: ignore[attr-defined]


def test_requests_sharing_an_event_loop_keep_their_own_ids(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tetriserve.test.loop")

    async def handle(rid: str) -> None:
        log_context.bind(rid)
        for step in range(3):
            logger.warning("%s step %d", rid, step)
            await asyncio.sleep(0)  # the other requests' steps run in between
        await asyncio.create_task(child(rid))  # a task started from the request's inherits its id

    async def child(rid: str) -> None:
        logger.warning("%s child", rid)

    async def main() -> None:
        await asyncio.gather(*(asyncio.create_task(handle(f"r{i}")) for i in range(4)))

    with caplog.at_level(logging.WARNING, "tetriserve.test.loop"):
        asyncio.run(main())
    lines = [r for r in caplog.records if r.name == "tetriserve.test.loop"]
    assert len(lines) == 16
    assert all(r.getMessage().split()[0] == r.request_id for r in lines)  # type: ignore[attr-defined]
    assert log_context.current() is None  # nothing leaked into the caller


def test_within_binds_a_callback_wherever_it_runs() -> None:
    seen: list[str] = []

    def on_delta(x: int) -> int:
        seen.append(_record().request_id)  # type: ignore[attr-defined]
        return x + 1

    wrapped = log_context.within("r9", TRACEPARENT, on_delta)
    thread = threading.Thread(target=wrapped, args=(1,))
    thread.start()
    thread.join()
    assert wrapped(2) == 3
    assert seen == ["r9", "r9"] and log_context.current() is None


def test_trace_ids_of_bad_traceparents_are_left_out() -> None:
    assert log_context.trace_id_of(None) is None
    assert log_context.trace_id_of("nonsense") is None
    assert log_context.trace_id_of("00-" + "0" * 32 + "-" + "b" * 16 + "-01") is None
    assert log_context.trace_id_of("00-" + "a" * 30 + "\n!" + "-" + "b" * 16 + "-01") is None  # no log injection
    assert log_context.trace_id_of(TRACEPARENT) == "a" * 32


def test_an_actor_process_gets_a_handler_only_when_nothing_handles_its_logs() -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    try:
        root.handlers.clear()
        log_context.configure_process()
        (handler,) = root.handlers
        assert handler.level == logging.WARNING and handler.formatter is not None
        assert handler.formatter._fmt == log_context.FORMAT  # type: ignore[union-attr]
        log_context.configure_process()  # once
        assert root.handlers == [handler]
    finally:
        root.handlers[:] = saved
