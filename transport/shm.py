"""Shared-memory backend: KV bytes cross between processes of one host through /dev/shm (issue #16).

A TCP endpoint carries only a small frame per transfer; the bytes go through a
POSIX shared-memory segment, written once by the sender and mapped, not
copied, by the receiver::

    sender                                        receiver
    segment = /dev/shm/tetriserve-kv-<id>         (listening as the TCP backend does)
    copy buffers into it (one memcpy)
    frame {key, sizes, shm: name} ──TCP──▶        map the segment, unlink its name, store views of it
                                     ◀── ack ──   (the memory goes when the last view is dropped)
    unmap; on any failure unlink the name

Only the sender ever holds an unmapped name, and it unlinks the name on every
failure, so a dead receiver strands nothing in /dev/shm; a dead sender's
segment is unlinked by the receiver the moment it maps it. A peer on another
host (its address names another host id) gets the bytes inline over TCP, as
the ``tcp`` backend sends them, so ``shm`` also serves a cluster that spans
hosts. Addresses look like ``shm://<host id>@host:port``; the host id tells
processes that share /dev/shm (same boot, same IPC namespace) apart from the
rest. Linux only.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import secrets
import socket
from pathlib import Path

from tetriserve.transport.tcp import TcpTransport, parse_address

SHM_DIR = Path("/dev/shm")
PREFIX = "tetriserve-kv-"


def host_id() -> str:
    """Processes with the same id share /dev/shm: same boot of the same kernel, same IPC namespace."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ipc = os.stat("/proc/self/ns/ipc").st_ino
    return hashlib.sha1(f"{boot}:{ipc}".encode()).hexdigest()[:12]


def split_address(address: str) -> tuple[str | None, str]:
    """(host id or None, host:port) of a ``shm://id@host:port`` or plain ``host:port`` address."""
    rest = address.removeprefix("shm://")
    hid, sep, hostport = rest.rpartition("@")
    return (hid if sep else None), hostport


class ShmTransport(TcpTransport):
    def __init__(self, listen: str = "127.0.0.1:0", ttl_s: float = 300.0, send_threads: int = 4) -> None:
        super().__init__(listen, ttl_s, send_threads)
        self._host_id = host_id()

    @property
    def address(self) -> str:
        return f"shm://{self._host_id}@{super().address}"

    # -- sending -----------------------------------------------------------------
    def _frame(self, dst: str, key: str, views: list[memoryview]) -> tuple[dict[str, object], list[memoryview]]:
        hid, _ = split_address(dst)
        total = sum(v.nbytes for v in views)
        if hid != self._host_id or total == 0:
            return super()._frame(dst, key, views)  # another host (or nothing to map): the bytes go inline
        name = PREFIX + secrets.token_hex(8)
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as segment:
                offset = 0
                for v in views:
                    segment[offset : offset + v.nbytes] = v
                    offset += v.nbytes
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        return {"shm": name}, []

    def _frame_done(self, header: dict[str, object], ok: bool) -> None:
        name = header.get("shm")
        if isinstance(name, str) and not ok:  # the receiver never took it: nobody else will unlink it
            _unlink(name)

    def _connect_to(self, dst: str) -> tuple[str, int]:
        return parse_address(split_address(dst)[1])

    # -- receiving ---------------------------------------------------------------
    def _payload(self, conn: socket.socket, header: dict[str, object], sizes: list[int]) -> list[memoryview]:
        name = header.get("shm")
        if not isinstance(name, str):
            return super()._payload(conn, header, sizes)
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"bad shared-memory segment name {name!r}")
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR)
        try:
            segment = mmap.mmap(fd, sum(sizes))
        finally:
            os.close(fd)
            _unlink(name)  # mapped (or failed): the name is not needed any more
        whole = memoryview(segment)
        views, offset = [], 0
        for n in sizes:
            views.append(whole[offset : offset + n])
            offset += n
        return views


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (SHM_DIR / name).unlink()
