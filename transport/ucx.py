"""UCX backend: KV bytes over UCX through ``ucxx``: tcp and shared memory, RDMA where the NIC has it.

Wire format, per transfer, on a pooled UCX endpoint (tag messages, in order)::

    u64 header_len | header (JSON: key, sizes) | each non-empty buffer, one message each
    receiver replies one byte: 0x01 stored, 0x00 dropped (key was discarded)

All UCX calls run as coroutines on one asyncio event loop per process, on a
daemon thread of its own (``ucxx``'s async API, whose worker progresses on
that loop and nowhere else: ``UCXPY_PROGRESS_MODE=blocking``, below): ``send``
schedules the transfer there and returns a polled ``TransferHandle``; nothing blocks the engine loop. Between
frames a receiving endpoint has no receive posted: it probes for the next frame (``_next_frame``), since ucxx
polls a posted request without pause, and a receive posted on an idle pooled endpoint keeps a core busy. A
deadline bounds connect, the messages and the acknowledgement together: past it the endpoint is
aborted (the peer sees its receive fail and marks the key failed) and the send
is ``FAILED``. A peer that dies breaks its endpoints: UCX's error handling
cancels the pending messages on the survivor, so both sides know at once.

Environment: without a GPU (no ``/dev/nvidiactl``) the backend sets ``UCX_RNDV_FRAG_MEM_TYPE=host`` before
``ucxx`` is imported (rendezvous fragments in host memory; an explicit setting wins), and everywhere
``UCXPY_PROGRESS_MODE=blocking`` (``UCX_DEFAULTS``; an explicit setting wins here too). ``UCX_TLS`` is UCX's
choice: every transport it finds (on a host without RDMA: tcp, shared memory ``posix``/``sysv``/``cma`` and
``self``; ``rc``/``dc`` RDMA and ``cuda_copy``/``cuda_ipc`` where the host has them); set e.g.
``UCX_TLS=tcp,sm,self`` to restrict it.
(UCX warns once at start that ``UCX_MEMTYPE_CACHE``, which ``ucxx`` sets, is unused by this build: harmless.)

Two-sided only: the ``ucxx`` Python bindings (0.52) expose tag and active messages but not UCX's
memory registration, remote keys or ``put``/``get`` (the C++ library has them), so this backend has no
one-sided ``read``/``write``. Addresses look like ``ucx://host:port`` (the UCX listener).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from tetriserve.transport.api import Buffer, Received, TransferHandle, advertised_host
from tetriserve.transport.store import ReceiveStore, StoreBackedEndpoint
from tetriserve.transport.tcp import ReceivePool, parse_address

logger = logging.getLogger(__name__)

UCX_CPU_DEFAULTS = {"UCX_RNDV_FRAG_MEM_TYPE": "host"}
# ucxx progresses its worker on our event loop's thread ("blocking": the loop wakes on the worker's event fd), not
# on a C++ thread of its own that calls back into Python (its default, "thread"): ucxx does not vouch for that
# mode in processes with several Python threads (rapidsai/ucxx#325), and ours have several. In that mode the
# transport tests' process died in 2 of 9 suite runs (a segfault on a thread without Python frames), and once the
# interpreter's own state was corrupted ("AST constructor recursion depth mismatch"); the mode is the likeliest
# cause, not a proven one (``docs/known-limits.md``; ``benchmarks/diagnostics/transport_tests_loop.sh`` reruns
# those tests until one dies of a signal).
UCX_DEFAULTS = {"UCXPY_PROGRESS_MODE": "blocking"}
_MAX_HEADER = 1 << 20
# a receiving endpoint's probes for its next frame (``_next_frame``): at once, then backing off from 50 µs to 2 ms
IDLE_PROBE_MIN_S, IDLE_PROBE_MAX_S = 50e-6, 2e-3

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None

T = TypeVar("T")
# what goes over an endpoint in one message: the frame's length and header, a buffer, the acknowledgement
_Message = npt.NDArray[np.uint8] | npt.NDArray[np.uint64] | Received


# ucxx has no type information: what this backend uses of it
class _Worker(Protocol):
    def progress(self) -> None: ...


class _Probe(Protocol):
    @property
    def matched(self) -> bool: ...


class _Context(Protocol):
    @property
    def progress_mode(self) -> str: ...

    @property
    def worker(self) -> _Worker: ...

    def tag_probe(self, tag: int) -> _Probe: ...


class _Endpoint(Protocol):
    @property
    def closed(self) -> bool: ...

    @property
    def _ctx(self) -> _Context: ...

    @property
    def _tags(self) -> Mapping[str, int]: ...

    async def send(self, buffer: _Message) -> None: ...

    async def recv(self, buffer: _Message) -> None: ...

    def abort(self) -> None: ...


class _Listener(Protocol):
    @property
    def port(self) -> int: ...

    def close(self) -> None: ...


class _Ucxx(Protocol):
    """The ``ucxx`` module."""

    def create_listener(self, callback: Callable[[_Endpoint], Coroutine[object, object, None]], port: int) -> _Listener:
        ...

    async def create_endpoint(self, host: str, port: int, connect_timeout: float) -> _Endpoint: ...


class _BlockingMode(Protocol):
    """ucxx's ``continuous_ucx_progress.BlockingMode``, as its reader callback uses it."""

    worker: _Worker
    armed: bool
    arm_task: asyncio.Task[None] | None
    event_loop: asyncio.AbstractEventLoop

    def _arm_worker(self) -> Coroutine[object, object, None]: ...


def _ucxx() -> _Ucxx:
    defaults = dict(UCX_DEFAULTS)
    if not os.path.exists("/dev/nvidiactl"):
        defaults.update(UCX_CPU_DEFAULTS)
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    import ucxx

    module: _Ucxx = ucxx
    return module


def _rearm_blocking_mode() -> None:
    """ucxx's blocking progress mode arms the worker's event descriptor once: its reader callback progresses the
    worker but never starts the arming task again (ucx-py's did), so after the first event the descriptor stays
    readable and the event loop spins on it, a core's worth of CPU while idle: without this, one idle pooled
    endpoint costs 5.00 s of CPU in 5 s, with it and ``_next_frame``'s probing 0.32 s (``python
    benchmarks/diagnostics/ucx_idle_cpu.py --variant blocking=98af462 --variant final=``, 98af462 being the
    code without the re-arming). This restores ucx-py's re-arming; ``ucx_loop`` calls it once per process."""
    from ucxx._lib_async import continuous_ucx_progress as progress

    def _fd_reader_callback(self: _BlockingMode) -> None:
        self.worker.progress()
        self.armed = False
        if self.arm_task is None or self.arm_task.done():
            self.arm_task = self.event_loop.create_task(self._arm_worker())

    progress.BlockingMode._fd_reader_callback = _fd_reader_callback


def ucx_loop() -> asyncio.AbstractEventLoop:
    """The process's UCX event loop, started on first use on a daemon thread (ucxx has one context per process)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _ucxx()
            _rearm_blocking_mode()
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="kv-ucx", daemon=True).start()
        return _loop


def split_ucx_address(address: str) -> tuple[str, int]:
    return parse_address(address.removeprefix("ucx://"))


class UcxTransport(StoreBackedEndpoint):
    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        ttl_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        store: ReceiveStore | None = None,
    ) -> None:
        super().__init__(ttl_s, store)
        host, port = split_ucx_address(listen)
        self._ucxx = _ucxx()
        self._loop = ucx_loop()
        self._connect_timeout_s = connect_timeout_s
        self._closed = False
        self._landing = ReceivePool()
        self._idle: dict[str, list[_Endpoint]] = {}  # dst -> idle endpoints (touched on the loop only)
        self._busy: set[_Endpoint] = set()  # endpoints of this transport in use, sending or serving
        self._pending: set[TransferHandle] = set()
        self._listener = self._call(self._listen(port))
        self._address = f"ucx://{advertised_host(host)}:{self._listener.port}"
        logger.info("ucx transport listening on %s (UCX_TLS=%s)", self._address, os.environ.get("UCX_TLS", "all"))

    def _call(self, coro: Coroutine[object, object, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _listen(self, port: int) -> _Listener:
        return self._ucxx.create_listener(self._serve, port=port)

    @property
    def address(self) -> str:
        return self._address

    # -- sending ---------------------------------------------------------------
    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        views = [memoryview(b).cast("B") for b in buffers]
        handle = TransferHandle(key, sum(v.nbytes for v in views))
        if self._closed:
            handle.complete("transport closed")
            return handle
        with self._stats_lock:
            self._pending.add(handle)
        asyncio.run_coroutine_threadsafe(self._send_now(dst, key, views, deadline_s, handle), self._loop)
        return handle

    async def _send_now(
        self, dst: str, key: str, views: list[memoryview], deadline_s: float, handle: TransferHandle
    ) -> None:
        try:
            remaining = deadline_s - (time.monotonic() - handle.started)
            await asyncio.wait_for(self._send_attempts(dst, key, views, handle), max(remaining, 0.001))
        except TimeoutError:
            self._finish(handle, f"send {key} to {dst} failed: deadline of {deadline_s:.3f} s passed")
        except Exception as exc:  # a bad address, a broken peer, or a bug: the handle must still complete
            self._finish(handle, f"send {key} to {dst} failed: {type(exc).__name__}: {exc}")
        finally:
            with self._stats_lock:
                self._pending.discard(handle)

    async def _send_attempts(self, dst: str, key: str, views: list[memoryview], handle: TransferHandle) -> None:
        header = json.dumps({"key": key, "sizes": [v.nbytes for v in views]}).encode()
        for attempt in (0, 1):  # a pooled endpoint may have gone stale: retry once on a fresh one
            ep = await self._checkout(dst, fresh=attempt > 0)
            try:
                await ep.send(np.array([len(header)], dtype=np.uint64))
                await ep.send(np.frombuffer(header, dtype=np.uint8))
                for v in views:
                    if v.nbytes:
                        await ep.send(v)
                ack = np.zeros(1, dtype=np.uint8)
                await ep.recv(ack)
            except asyncio.CancelledError:  # the deadline: the peer must see the frame break, not wait on it
                self._abort(ep)
                raise
            except Exception as exc:
                self._abort(ep)
                if attempt == 1:
                    raise
                logger.debug("ucx transport: pooled endpoint to %s broke (%s); retrying on a fresh one", dst, exc)
                continue
            self._busy.discard(ep)
            if not self._closed:
                self._idle.setdefault(dst, []).append(ep)
            self._finish(handle, None if ack[0] == 1 else f"receiver dropped {key} (discarded)")
            return

    async def _checkout(self, dst: str, fresh: bool) -> _Endpoint:
        idle = self._idle.get(dst)
        while idle and not fresh:
            ep = idle.pop()
            if not ep.closed:
                self._busy.add(ep)
                return ep
        host, port = split_ucx_address(dst)
        # Is anyone listening? A refused TCP connect says no at once; ucxx would wait out its connect timeout.
        _, writer = await asyncio.open_connection(host, port)
        writer.close()
        ep = await self._ucxx.create_endpoint(host, port, connect_timeout=self._connect_timeout_s)
        self._busy.add(ep)
        return ep

    def _abort(self, ep: _Endpoint) -> None:
        self._busy.discard(ep)
        with contextlib.suppress(Exception):
            ep.abort()

    # -- receiving -------------------------------------------------------------
    async def _serve(self, ep: _Endpoint) -> None:
        """One peer endpoint's frames, one after another, until it closes or breaks."""
        self._busy.add(ep)
        try:
            while not self._closed:
                if not await self._next_frame(ep):
                    return
                length = np.zeros(1, dtype=np.uint64)
                try:
                    await ep.recv(length)
                except Exception:  # the sender closed its endpoint, or died between transfers
                    return
                if not 0 < int(length[0]) <= _MAX_HEADER:
                    logger.warning("ucx transport: bad frame from peer, closing endpoint")
                    return
                if not await self._serve_frame(ep, int(length[0])):
                    return
        finally:
            self._abort(ep)

    async def _next_frame(self, ep: _Endpoint) -> bool:
        """Wait until the next frame's first message has reached ``ep``, with no receive posted meanwhile; False
        once ``ep`` or this transport is closed. ucxx awaits a posted request by polling it on the loop without a
        pause (its ``wait_yield``), so a receive posted on an idle pooled endpoint keeps a core busy for as long
        as the endpoint lives: 5.17 s of CPU in 5 s idle in ucxx's default mode, against 0.32 s with this probing
        (``python benchmarks/diagnostics/ucx_idle_cpu.py --variant posted=c3bfc51 --variant final=``, c3bfc51
        being code that keeps a receive posted). So the loop progresses the worker and probes for the endpoint's
        tag, at once and then backing off to ``IDLE_PROBE_MAX_S`` between probes: at most that much latency for a
        frame that comes after a pause."""
        if ep.closed:
            return False
        ctx, tag = ep._ctx, ep._tags["msg_recv"]  # ucxx's own: the tag its recv matches on this endpoint
        ours = not ctx.progress_mode.startswith("thread")  # the worker progresses on this loop: here, then
        delay = 0.0
        while not self._closed and not ep.closed:
            if ours:
                ctx.worker.progress()
            if ctx.tag_probe(tag).matched:
                return True
            await asyncio.sleep(delay)
            delay = min(max(2 * delay, IDLE_PROBE_MIN_S), IDLE_PROBE_MAX_S)
        return False

    async def _serve_frame(self, ep: _Endpoint, header_len: int) -> bool:
        key = None
        try:
            raw = np.zeros(header_len, dtype=np.uint8)
            await ep.recv(raw)
            header = json.loads(raw.tobytes())
            key = str(header["key"])
            buffers = self._landing.views([int(n) for n in header["sizes"]])
            for buf in buffers:
                if len(buf):
                    await ep.recv(buf)
            if self._closed:
                return False
            stored = self._store.put(key, buffers)
            await ep.send(np.array([1 if stored else 0], dtype=np.uint8))
            return True
        except Exception as exc:  # the sender died or gave up mid-transfer: say so now, not at a deadline
            logger.warning("ucx transport: receive of %s failed: %s: %s", key, type(exc).__name__, exc)
            if key is not None and not self._store.has(key):
                self._store.fail(key, f"transfer of {key} broke off: {exc or type(exc).__name__}")
            return False

    # -- shutdown --------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=10.0)
        with self._stats_lock:
            pending = list(self._pending)
        for handle in pending:
            self._finish(handle, "transport closed")

    async def _shutdown(self) -> None:
        endpoints = [*self._busy, *(ep for idle in self._idle.values() for ep in idle)]
        self._busy.clear()
        self._idle.clear()
        for ep in endpoints:
            with contextlib.suppress(Exception):
                ep.abort()
        await asyncio.sleep(0)  # let the handlers of the aborted endpoints return before the listener goes
        self._listener.close()
