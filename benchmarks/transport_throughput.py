"""GB/s of each KV transport backend beside the raw ceiling of the same path, in one run.

    python benchmarks/transport_throughput.py --sizes-mib 1 4 16 64 256 --repeats 5 --rounds 5

For each size, one endpoint sends one buffer of that size to another, in a separate process (as between two
workers), and the time runs from ``send`` until the receiver's ``recv`` has it (the sender's handle is DONE
only once the receiver acknowledged it). Ceilings, measured in the same run:

    shm   one ``torch`` tensor copy of the same size, one thread (as in a worker process), into a buffer reused
          every time (the shm backend copies into a slab it reuses) and into one allocated for it; shm's
          one-sided pull (a published slab the other process maps, nothing copied) beside its push
    tcp   the same bytes through a plain loopback socket between the same two processes (sendall/recv_into)
    ucx   raw ``ucxx`` tag send/recv of the same bytes between two processes, a one-byte ack back (with the backend's
          UCX settings: UCX_RNDV_FRAG_MEM_TYPE=host without a GPU, UCX_TLS left to UCX)
    nccl  raw ``torch.distributed`` send/recv on a two-rank group built over a TCPStore as the backend builds
          its pairs (gloo here, no CUDA), a one-byte tensor back as the ack

Writes ``benchmarks/results/transport_throughput.{md,json}``; with ``--backends`` naming some of them,
``transport_throughput_<names>.{md,json}`` (e.g. ``--backends ucx nccl``: those two alone). Each round prints a
line as it starts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import measure_or_reload
from transport_throughput_report import report

MIB = 1 << 20
BACKEND_GROUPS = ("shm", "ucx", "nccl")  # shm's table has tcp beside it


def recv_landed(endpoint: Any, key: str) -> list[Any]:
    """``key``'s buffers once they land in ``endpoint``, asleep on its store until then: no poller here competes
    with the thread that receives them."""
    while True:
        version = endpoint.store.version()
        if (buffers := endpoint.recv(key)) is not None:
            return buffers
        endpoint.store.wait_newer(version, 1.0)


def _receiver(kind: str, conn: Any) -> None:
    """The receiving process: an endpoint (or a plain socket) that takes what arrives and says when."""
    if kind == "socket":
        server = socket.create_server(("127.0.0.1", 0))
        conn.send(f"127.0.0.1:{server.getsockname()[1]}")
        peer, _ = server.accept()
        buf = bytearray(max(conn.recv()) * MIB)
        view = memoryview(buf)
        while True:
            n = int.from_bytes(peer.recv(8, socket.MSG_WAITALL), "big")
            if n == 0:
                return
            got = 0
            while got < n:
                got += peer.recv_into(view[got:n], n - got)
            peer.sendall(b"\x01")
    from tetriserve.transport.registry import make_transport

    endpoint = make_transport("shm" if kind == "shm-pull" else kind, "127.0.0.1:0")
    conn.send(endpoint.address)
    while True:
        key = conn.recv()
        if key is None:
            endpoint.close()
            return
        if kind == "shm-pull":  # (the publisher's address, the key): take it from there
            src, key = key
            endpoint.pull(src, key, 120.0)
        bufs = recv_landed(endpoint, key)
        conn.send(time.perf_counter())
        del bufs


def _backend(kind: str, sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """``kind``'s send (``shm-pull``: shm's one-sided pull, this process publishing a buffer in a slab, filled in
    place as the packer does, and the other pulling it), timed until the other process's ``recv`` has it."""
    from tetriserve.transport.api import TransferState
    from tetriserve.transport.registry import make_transport

    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_receiver, args=(kind, child), daemon=True)
    proc.start()
    address = parent.recv()
    sender = make_transport("shm" if kind == "shm-pull" else kind, "127.0.0.1:0")
    out: dict[int, list[float]] = {}
    try:
        for size in sizes:
            payload = bytearray(size * MIB)
            for r in range(repeats + 1):  # the first of each size warms the path
                key = f"{size}-{r}"
                if kind == "shm-pull":
                    reserved = sender.reserve([size * MIB])
                    reserved[0][:] = payload  # the packer's gather, before anyone asks
                    sender.publish(key, reserved)
                    del reserved
                    t0 = time.perf_counter()
                    parent.send((sender.address, key))
                else:
                    parent.send(key)
                    t0 = time.perf_counter()
                    handle = sender.send(address, key, [payload], 120.0)
                    assert handle.wait(120.0) is TransferState.DONE, handle.error
                landed = parent.recv()
                if r:
                    out.setdefault(size, []).append(size * MIB / (landed - t0) / 1e9)
    finally:
        parent.send(None)
        proc.join(10)
        sender.close()
    return out


def _raw_ucx_receiver(conn: Any) -> None:
    import asyncio

    import numpy as np

    from tetriserve.transport.ucx import ucx_loop

    ucxx, loop = __import__("ucxx"), ucx_loop()
    buf = np.empty(max(conn.recv()) * MIB, dtype=np.uint8)

    async def serve(ep: Any) -> None:
        n = np.zeros(1, dtype=np.uint64)
        while True:
            await ep.recv(n)
            if int(n[0]) == 0:
                return
            await ep.recv(buf[: int(n[0])])
            await ep.send(np.ones(1, dtype=np.uint8))

    async def listen() -> Any:
        return ucxx.create_listener(serve, port=0)

    listener = asyncio.run_coroutine_threadsafe(listen(), loop).result(30)
    conn.send(listener.port)
    conn.recv()  # the sender is done


def _raw_ucx(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    import asyncio

    import numpy as np

    from tetriserve.transport.ucx import ucx_loop

    ucxx, loop = __import__("ucxx"), ucx_loop()
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_raw_ucx_receiver, args=(child,), daemon=True)
    proc.start()
    parent.send(sizes)
    port = parent.recv()

    async def run() -> dict[int, list[float]]:
        ep = await ucxx.create_endpoint("127.0.0.1", port)
        ack = np.zeros(1, dtype=np.uint8)
        out: dict[int, list[float]] = {}
        for size in sizes:
            payload = bytearray(size * MIB)  # as the backends' rows send
            for r in range(repeats + 1):
                t0 = time.perf_counter()
                await ep.send(np.array([size * MIB], dtype=np.uint64))
                await ep.send(payload)
                await ep.recv(ack)
                if r:
                    out.setdefault(size, []).append(size * MIB / (time.perf_counter() - t0) / 1e9)
        await ep.send(np.zeros(1, dtype=np.uint64))
        return out

    try:
        return asyncio.run_coroutine_threadsafe(run(), loop).result(600)
    finally:
        parent.send(None)
        proc.join(10)


def exchange(group: Any, rank: int, payload: Any, ack: Any) -> None:
    """One transfer on a two-rank group: rank 0 sends ``payload``, rank 1 answers with the one-byte ``ack``."""
    if rank == 0:
        group.send([payload], 1, 0).wait()
        group.recv([ack], 1, 1).wait()
    else:
        group.recv([payload], 0, 0).wait()
        group.send([ack], 0, 1).wait()


def free_port() -> int:
    probe = socket.create_server(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


def _raw_gloo_rank(rank: int, port: int, sizes: list[int], repeats: int, conn: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60), wait_for_workers=False)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = datetime.timedelta(seconds=120)
    group = dist.ProcessGroupGloo(store, rank, 2, options)
    ack = torch.ones(1, dtype=torch.uint8)
    out: dict[int, list[float]] = {}
    for size in sizes:
        payload = torch.frombuffer(bytearray(size * MIB), dtype=torch.uint8)  # as the backends' rows send
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            exchange(group, rank, payload, ack)
            if r:
                out.setdefault(size, []).append(size * MIB / (time.perf_counter() - t0) / 1e9)
    if conn is not None:
        conn.send(out)


def _raw_gloo(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    port = free_port()
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_raw_gloo_rank, args=(1, port, sizes, repeats, None), daemon=True)
    proc.start()
    _raw_gloo_rank(0, port, sizes, repeats, child)
    proc.join(30)
    return dict(parent.recv())


def _socket(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_receiver, args=("socket", child), daemon=True)
    proc.start()
    host, port = parent.recv().split(":")
    parent.send(sizes)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: dict[int, list[float]] = {}
    try:
        for size in sizes:
            payload = bytearray(size * MIB)
            for r in range(repeats + 1):
                t0 = time.perf_counter()
                sock.sendall((size * MIB).to_bytes(8, "big"))
                sock.sendall(payload)
                sock.recv(1)
                if r:
                    out.setdefault(size, []).append(size * MIB / (time.perf_counter() - t0) / 1e9)
    finally:
        sock.sendall((0).to_bytes(8, "big"))
        proc.join(10)
        sock.close()
    return out


def _copies(sizes: list[int], repeats: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    import torch

    torch.set_num_threads(1)  # as in a worker process (engine.threads_per_engine), where the sender copies
    fresh: dict[int, list[float]] = {}
    reused: dict[int, list[float]] = {}
    for size in sizes:
        src = torch.ones(size * MIB, dtype=torch.uint8)
        dst = torch.empty_like(src)
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            torch.empty_like(src).copy_(src)
            t1 = time.perf_counter()
            dst.copy_(src)
            t2 = time.perf_counter()
            if r:
                fresh.setdefault(size, []).append(size * MIB / (t1 - t0) / 1e9)
                reused.setdefault(size, []).append(size * MIB / (t2 - t1) / 1e9)
    return fresh, reused


def _measure_group(group: str, sizes: list[int], n: int, ceilings_first: bool) -> dict[str, Any]:
    """One round of ``group``: each backend and the raw path it rides, the ceilings first or last."""

    def ceilings() -> dict[str, Any]:
        if group == "shm":
            fresh, reused = _copies(sizes, n)
            return {"copy_fresh": fresh, "copy_reused": reused, "socket": _socket(sizes, n)}
        return {"raw_ucx": _raw_ucx(sizes, n)} if group == "ucx" else {"raw_gloo": _raw_gloo(sizes, n)}

    def backends() -> dict[str, Any]:
        kinds = {"shm": ("shm", "tcp", "shm-pull"), "ucx": ("ucx",), "nccl": ("nccl",)}[group]
        return {kind.replace("-", "_"): _backend(kind, sizes, n) for kind in kinds}

    return ceilings() | backends() if ceilings_first else backends() | ceilings()  # the left one runs first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="each backend and its ceiling this many times, alternating")
    ap.add_argument("--backends", nargs="+", choices=BACKEND_GROUPS, default=list(BACKEND_GROUPS),
                    help="measure these (shm also measures tcp: one table), each beside its raw path")  # fmt: skip
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    groups = [g for g in BACKEND_GROUPS if g in args.backends]

    def measure() -> dict[str, Any]:
        load_before = os.getloadavg()[0]
        rounds = []
        for r in range(args.rounds):
            run: dict[str, Any] = {}
            for group in groups:
                print(f"round {r + 1} of {args.rounds}: {group}", flush=True)
                run |= _measure_group(group, args.sizes_mib, args.repeats, ceilings_first=r % 2 == 1)
            rounds.append(run)
        return {"sizes_mib": args.sizes_mib, "rounds": rounds, "loadavg_1min": [load_before, os.getloadavg()[0]]}

    name = "transport_throughput" + ("" if groups == list(BACKEND_GROUPS) else "_" + "_".join(groups))
    return measure_or_reload(name, args.report_only, measure, report)


if __name__ == "__main__":
    raise SystemExit(main())
