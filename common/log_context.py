"""The request id (and trace id) on every log line of a request's path.

    bind(request_id, traceparent)     first thing in the asyncio task that handles a request (a front door's
                                      stream, a prefill worker's task per request): a ``ContextVar``, so
                                      requests sharing one event loop keep their own ids, and tasks started
                                      from there inherit them
    bound(request_id, traceparent)    a ``with`` block, around work done outside such a task
    within(request_id, tp, callback)  ``callback`` run with the ids bound (engine deltas reach the decode
                                      worker as callbacks from the engine thread, outside any request's task)
    install()                         a LogRecord factory: every record gets ``request_id`` ("-" outside a
                                      request), ``trace_id`` ("-" without a traceparent) and ``request_tag``
                                      (`` [req=<id> trace=<trace id>]``, or "" outside a request)
    FORMAT                            the log format of the CLI and of every actor: it shows ``request_tag``

A record factory, not a handler filter, so every handler (Ray's, pytest's, a JSON one) sees the fields.
Code on the engine thread has no request context and names its request ids in its messages.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

_T = TypeVar("_T")
_P = ParamSpec("_P")

FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"

_current: ContextVar[tuple[str, str | None] | None] = ContextVar("tetriserve_request", default=None)
_installed = False
_HEX = "0123456789abcdef"


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C traceparent (``00-<trace id>-<span id>-<flags>``), None if it is not one."""
    if not traceparent or len(traceparent) < 55 or traceparent[2] != "-" or traceparent[35] != "-":
        return None
    trace_id = traceparent[3:35].lower()  # a client's header: only hex reaches a log line
    return None if trace_id.strip(_HEX) or trace_id == "0" * 32 else trace_id


def bind(request_id: str | None, traceparent: str | None = None) -> None:
    """Log lines of this task (and of tasks it starts) belong to ``request_id`` from now on."""
    _current.set(None if request_id is None else (request_id, trace_id_of(traceparent)))


@contextlib.contextmanager
def bound(request_id: str, traceparent: str | None = None) -> Iterator[None]:
    token = _current.set((request_id, trace_id_of(traceparent)))
    try:
        yield
    finally:
        _current.reset(token)


def within(request_id: str, traceparent: str | None, callback: Callable[_P, _T]) -> Callable[_P, _T]:
    """``callback`` that runs with ``request_id`` bound, wherever it is called from."""
    ids = (request_id, trace_id_of(traceparent))

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        token = _current.set(ids)
        try:
            return callback(*args, **kwargs)
        finally:
            _current.reset(token)

    return call


def current() -> tuple[str, str | None] | None:
    """(request id, trace id) bound here, or None."""
    return _current.get()


def install() -> None:
    """Give every log record of this process ``request_id``, ``trace_id`` and ``request_tag`` (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        ids = _current.get()
        if ids is None:
            record.request_id, record.trace_id, record.request_tag = "-", "-", ""
        else:
            rid, tid = ids
            record.request_id, record.trace_id = rid, tid or "-"
            record.request_tag = f" [req={rid}]" if tid is None else f" [req={rid} trace={tid}]"
        return record

    logging.setLogRecordFactory(factory)


def configure_process(level: int = logging.WARNING) -> None:
    """An actor process: ``install`` and, when nothing handles its logs yet (Ray leaves the root logger bare,
    so only Python's last-resort handler prints, warnings and up without any context), a stderr handler in
    ``FORMAT`` at ``level``, so those lines carry the time, the logger and the request."""
    install()
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.setLevel(level)
        root.addHandler(handler)
