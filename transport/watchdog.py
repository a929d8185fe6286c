"""A deadline watchdog for blocking operations that may never return (issue #16: NCCL and gloo can hang when a
peer dies). An operation runs inside ``watch(deadline, on_expire, sock)``; one thread calls ``on_expire`` once
the deadline passes with the operation still running, or as soon as the peer closes ``sock`` (a control socket
the peer leaves silent during the operation), so the caller fails the transfer and tears its channel down
instead of waiting on a library that has not noticed the peer is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any


class Watchdog:
    """Calls ``on_expire`` for each watched operation still running past its deadline, or whose peer hung up
    first (its control socket closed: NCCL and gloo may not notice a dead peer). One thread per endpoint."""

    POLL_S = 0.05  # how often the control sockets of running operations are looked at

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._watched: dict[int, tuple[float, Callable[[], None], socket.socket | None]] = {}
        self._ids = itertools.count()
        self._closed = False
        threading.Thread(target=self._run, name="kv-nccl-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watch(self, deadline: float, on_expire: Callable[[], None], sock: socket.socket | None = None) -> Any:
        """``sock``: the pair's control socket, which the peer leaves silent during the operation."""
        wid = next(self._ids)
        with self._cv:
            self._watched[wid] = (deadline, on_expire, sock)
            self._cv.notify()
        try:
            yield
        finally:
            with self._cv:
                self._watched.pop(wid, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [w for w, (d, _, sock) in self._watched.items() if d <= now or (sock and _hung_up(sock))]
                expired = [self._watched.pop(w)[1] for w in due]
                if not expired:
                    if self._closed:
                        return
                    nxt = min((d for d, _, _ in self._watched.values()), default=now + 1.0)
                    if any(sock is not None for _, _, sock in self._watched.values()):
                        nxt = min(nxt, now + self.POLL_S)
                    self._cv.wait(max(nxt - now, 0.001))
                    continue
            for fn in expired:
                with contextlib.suppress(Exception):
                    fn()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (or it broke); data waiting to be read is not a hang-up. Never blocks
    (``select`` first: a socket with a timeout waits in ``recv`` even with ``MSG_DONTWAIT``)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):  # closed (fileno -1) or broken
        return True
