"""NCCL backend: KV bytes through ``torch.distributed`` point-to-point on a stateless group per pair.

NCCL on CUDA, gloo on CPU (so it runs and is tested here); the backend is named ``nccl`` either way. vLLM owns
the default process group inside each engine process, so this never calls ``init_process_group``: every
(sender, receiver) pair gets a two-rank group of its own, a ``ProcessGroupGloo``/``ProcessGroupNCCL`` built
directly over a ``TCPStore`` the sender hosts (rank 0 sends, rank 1 receives)::

    sender                                           receiver (listens on nccl://host:port, TCP)
    TCPStore(master) ; connect ─ hello {store} ─▶    TCPStore(client)
    group(rank 0)   ◀────── both build the group ──▶ group(rank 1)
    per transfer:
      frame {key, sizes, deadline_s} ─TCP─▶
      group.send(buffer) for each non-empty one ──▶  group.recv into landing buffers
                        ◀─TCP─ ack: 0x01 stored, 0x00 dropped (key was discarded)

Two-sided only. NCCL (and gloo, when a peer stops without closing) can block forever, so every operation runs
under a watchdog with the transfer's deadline: past it, or as soon as the peer closes the control socket (it
died: the collective library may not notice), the transfer is ``FAILED`` (the receiver marks its key failed),
the pair's control socket is shut (the peer's side of the transfer fails at once) and its group aborted, and
the next transfer between the two builds a fresh pair. A thread stuck in the aborted group is
abandoned (daemon); the group's own timeout (``group_timeout_s``) bounds it. Transfers between one pair are
serialized; different destinations proceed in parallel on ``send_threads`` threads.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import socket
import struct
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore  # what torch.distributed re-exports, not marked public there

from tetriserve.transport.api import Buffer, TransferHandle, advertised_host
from tetriserve.transport.store import StoreBackedEndpoint
from tetriserve.transport.tcp import ReceivePool, _recv_exact, parse_address
from tetriserve.transport.watchdog import Watchdog

logger = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
_MAX_HEADER = 1 << 20


def split_nccl_address(address: str) -> tuple[str, int]:
    return parse_address(address.removeprefix("nccl://"))


def _tensor(view: memoryview) -> torch.Tensor:
    with warnings.catch_warnings():  # a sender's bytes are read-only; the group only reads them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(view, dtype=torch.uint8)


class _Frame(TypedDict, total=False):
    """A control message, as JSON: the sender's hello (where its store listens) or a transfer's header."""

    store: list[str | int]  # hello: [host, port]
    key: str  # transfer: the key, the bytes of each buffer
    sizes: list[int]
    deadline_s: float  # both: what is left of the deadline


class _Work(Protocol):
    def wait(self) -> object: ...


class _Group(Protocol):
    """The point-to-point calls of a ``ProcessGroupGloo``/``ProcessGroupNCCL``."""

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int, /) -> _Work: ...

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int, /) -> _Work: ...


def _send_frame(sock: socket.socket, obj: _Frame) -> None:
    raw = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)


def _recv_frame(sock: socket.socket) -> _Frame:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > _MAX_HEADER:
        raise ValueError(f"frame header of {n} bytes")
    frame: _Frame = json.loads(_recv_exact(sock, n))
    return frame


@dataclass(eq=False)
class _Pair:
    """One end of a two-rank group with its control socket; ``broken`` once torn down (never reused)."""

    sock: socket.socket
    group: _Group
    store: TCPStore
    lock: threading.Lock = field(default_factory=threading.Lock)
    broken: bool = False

    def tear_down(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for name in ("abort", "shutdown"):
            fn = getattr(self.group, name, None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn()
                return


class NcclTransport(StoreBackedEndpoint):
    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        ttl_s: float = 300.0,
        send_threads: int = 4,
        backend: str | None = None,
        group_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(ttl_s)
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"transport nccl: backend must be nccl or gloo, got {self.backend!r}")
        self._device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self._group_timeout = datetime.timedelta(seconds=group_timeout_s)
        host, port = split_nccl_address(listen)
        self._host = advertised_host(host)
        self._server = socket.create_server((host, port))
        self._address = f"nccl://{self._host}:{self._server.getsockname()[1]}"
        self._closed = threading.Event()
        self._watchdog = Watchdog()
        self._landing = ReceivePool()
        self._pairs: dict[str, _Pair] = {}
        self._pairs_lock = threading.Lock()
        self._dst_locks: dict[str, threading.Lock] = {}
        self._served: set[_Pair | socket.socket] = set()
        self._pending: set[TransferHandle] = set()
        self._executor = ThreadPoolExecutor(max_workers=send_threads, thread_name_prefix="kv-nccl-send")
        threading.Thread(target=self._accept_loop, name="kv-nccl-listen", daemon=True).start()
        logger.info("nccl transport (%s) listening on %s", self.backend, self._address)

    @property
    def address(self) -> str:
        return self._address

    def _group(self, store: TCPStore, rank: int) -> _Group:
        group: object
        if self.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._group_timeout
            group = dist.ProcessGroupNCCL(store, rank, 2, options)
        else:
            gloo = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's stub names it Options
            gloo._timeout = self._group_timeout
            gloo._devices = [dist.ProcessGroupGloo.create_device(hostname=self._host)]
            group = dist.ProcessGroupGloo(store, rank, 2, gloo)
        return group  # type: ignore[return-value]  # both have send and recv; torch's stubs give them neither

    # -- sending ---------------------------------------------------------------
    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        views = [memoryview(b).cast("B") for b in buffers]
        handle = TransferHandle(key, sum(v.nbytes for v in views))
        if self._closed.is_set():
            handle.complete("transport closed")
            return handle
        with self._stats_lock:
            self._pending.add(handle)
        self._executor.submit(self._send_now, dst, key, views, handle.started + deadline_s, handle)
        return handle

    def _send_now(self, dst: str, key: str, views: list[memoryview], deadline: float, handle: TransferHandle) -> None:
        pair: _Pair | None = None

        def expire() -> None:
            self._finish(handle, f"send {key} to {dst} failed: its deadline passed or the receiver hung up")
            if pair is not None:
                self._drop_pair(dst, pair)

        try:
            with self._watchdog.watch(deadline, expire):
                pair = self._checkout(dst, deadline)
            with self._watchdog.watch(deadline, expire, pair.sock):
                if not pair.lock.acquire(timeout=max(deadline - time.monotonic(), 0.001)):
                    raise TimeoutError("deadline passed waiting for the pair's earlier transfers")
                try:
                    stored = self._transfer(pair, key, views, deadline)
                finally:
                    pair.lock.release()
            self._finish(handle, None if stored else f"receiver dropped {key} (discarded)")
        except Exception as exc:  # a dead peer, a torn-down pair, a bad address: the handle must still complete
            if pair is not None:
                self._drop_pair(dst, pair)
            self._finish(handle, f"send {key} to {dst} failed: {type(exc).__name__}: {exc}")
        finally:
            with self._stats_lock:
                self._pending.discard(handle)

    def _transfer(self, pair: _Pair, key: str, views: list[memoryview], deadline: float) -> bool:
        if pair.broken:
            raise ConnectionError("the pair was torn down")
        sizes = [v.nbytes for v in views]
        _send_frame(pair.sock, {"key": key, "sizes": sizes, "deadline_s": max(deadline - time.monotonic(), 0.0)})
        for v in views:
            if v.nbytes:
                tensor = _tensor(v) if self._device is None else _tensor(v).to(self._device)
                pair.group.send([tensor], 1, 0).wait()
        pair.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        return _recv_exact(pair.sock, 1) == b"\x01"

    def _checkout(self, dst: str, deadline: float) -> _Pair:
        with self._pairs_lock:
            pair = self._pairs.get(dst)
            if pair is not None and not pair.broken:
                return pair
            dst_lock = self._dst_locks.setdefault(dst, threading.Lock())
        if not dst_lock.acquire(timeout=max(deadline - time.monotonic(), 0.001)):
            raise TimeoutError("deadline passed waiting for the pair to be built")
        try:
            with self._pairs_lock:
                pair = self._pairs.get(dst)
            if pair is not None and not pair.broken:
                return pair
            pair = self._connect(dst, deadline)
            with self._pairs_lock:
                self._pairs[dst] = pair
            return pair
        finally:
            dst_lock.release()

    def _connect(self, dst: str, deadline: float) -> _Pair:
        """Build the group with ``dst``: host its store, tell it where over TCP, both ranks join."""
        sock = socket.create_connection(split_nccl_address(dst), timeout=max(deadline - time.monotonic(), 0.001))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            timeout = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001))
            store = TCPStore(self._host, 0, 2, True, timeout, wait_for_workers=False)
            _send_frame(sock, {"store": [self._host, store.port], "deadline_s": timeout.total_seconds()})
            group = self._group(store, 0)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return _Pair(sock, group, store)

    def _drop_pair(self, dst: str, pair: _Pair) -> None:
        with self._pairs_lock:
            if self._pairs.get(dst) is pair:
                del self._pairs[dst]
        pair.tear_down()

    # -- receiving -------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="kv-nccl-recv", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One sender's pair: join its group, then receive its transfers one after another until it goes."""
        pair: _Pair | None = None
        with self._stats_lock:
            self._served.add(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _recv_frame(conn)
            deadline = time.monotonic() + float(hello["deadline_s"])
            with self._watchdog.watch(deadline, lambda: conn.shutdown(socket.SHUT_RDWR)):
                host, port = hello["store"]
                timeout = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001))
                store = TCPStore(str(host), int(port), 2, False, timeout)
                pair = _Pair(conn, self._group(store, 1), store)
            with self._stats_lock:
                self._served.add(pair)
            while not self._closed.is_set() and self._serve_one(pair):
                pass
        except (OSError, ConnectionError, ValueError, KeyError, RuntimeError) as exc:
            logger.debug("nccl transport: pair from a sender ended: %s", exc)
        finally:
            with self._stats_lock:
                self._served.discard(conn)
                self._served.discard(pair)
            if pair is not None:
                pair.tear_down()
            else:
                conn.close()

    def _serve_one(self, pair: _Pair) -> bool:
        try:
            header = _recv_frame(pair.sock)
        except (OSError, ConnectionError, ValueError):
            return False  # the sender closed the pair, or died between transfers
        key = str(header["key"])

        def expire() -> None:
            self._store.fail(key, f"transfer of {key} broke off: its deadline passed or the sender hung up")
            pair.tear_down()

        try:
            with self._watchdog.watch(time.monotonic() + float(header["deadline_s"]) + 1.0, expire, pair.sock):
                buffers = self._landing.views([int(n) for n in header["sizes"]])
                for buf in buffers:
                    if len(buf):
                        self._recv_into(pair, memoryview(buf))
            if pair.broken or self._closed.is_set():
                return False
            stored = self._store.put(key, buffers)
            pair.sock.sendall(b"\x01" if stored else b"\x00")
            return True
        except Exception as exc:  # the sender died or gave up mid-transfer: say so now, not at a deadline
            logger.warning("nccl transport: receive of %s failed: %s: %s", key, type(exc).__name__, exc)
            if not self._store.has(key):
                self._store.fail(key, f"transfer of {key} broke off: {exc}")
            return False

    def _recv_into(self, pair: _Pair, view: memoryview) -> None:
        target = _tensor(view)
        if self._device is None:
            pair.group.recv([target], 0, 0).wait()
            return
        staging = torch.empty(view.nbytes, dtype=torch.uint8, device=self._device)
        pair.group.recv([staging], 0, 0).wait()
        target.copy_(staging)

    # -- shutdown --------------------------------------------------------------
    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._pairs_lock:
            pairs, self._pairs = list(self._pairs.values()), {}
        with self._stats_lock:
            served, self._served = list(self._served), set()
            pending = list(self._pending)
        for pair in pairs:
            pair.tear_down()
        for item in served:
            if isinstance(item, _Pair):
                item.tear_down()
            else:
                with contextlib.suppress(OSError):
                    item.shutdown(socket.SHUT_RDWR)
        self._executor.shutdown(wait=False, cancel_futures=True)
        for handle in pending:
            self._finish(handle, "transport closed")
        self._watchdog.close()
