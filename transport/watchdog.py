"""A deadline watchdog for blocking operations that may never return (NCCL and gloo can hang when a peer
dies). An operation runs inside ``watch(deadline, on_expire, sock)``; one thread calls ``on_expire`` once
the deadline passes with the operation still running, or as soon as the peer closes ``sock`` (a control socket
the peer leaves silent during the operation), so the caller fails the transfer and tears its channel down
instead of waiting on a library that has not noticed the peer is gone.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import itertools
import select
import socket
import termios
import threading
import time
from collections.abc import Callable, Iterator


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
    def watch(
        self, deadline: float, on_expire: Callable[[], None], sock: socket.socket | None = None
    ) -> Iterator[None]:
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
                watched = list(self._watched.items())
            now = time.monotonic()  # sockets are probed without the lock: watch() never waits on a probe
            due = {w for w, (d, _, sock) in watched if d <= now or (sock is not None and _hung_up(sock))}
            with self._cv:
                expired = [self._watched.pop(w)[1] for w in due if w in self._watched]
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


_HANG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (or it broke); data waiting to be read is not a hang-up. Never blocks and
    never reads: ``poll`` for the peer's shutdown (``POLLRDHUP``), not ``recv(MSG_PEEK)``, which on a socket with
    a timeout waits for data when another thread took what ``select`` saw."""
    try:
        fd = sock.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, _HANG_UP)
        if not any(events & _HANG_UP for _, events in poller.poll(0)):
            return False
        pending = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, pending)  # bytes it sent before closing are read first
        return pending[0] == 0
    except (OSError, ValueError):  # closed or broken
        return True
