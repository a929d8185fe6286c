"""Where one ``shm`` push's time goes, part by part.

    python benchmarks/diagnostics/shm_push_parts.py --sizes-mib 16 64 --repeats 10

``transport_throughput.py`` holds the push to a one-thread copy of the same size; what the push adds to that copy is
measured here. One endpoint pushes a buffer to another in a separate process, as there (the receiving process
asleep on its store until something lands), and marks on one clock (``perf_counter``, system-wide): ``send``
called; its sending thread started (``handoff``); a slab taken (``slab``); the bytes copied into it (``copy``); the
frame written to the UNIX socket (``frame``, overlapping the next); the receiver's store took the views
(``to_store``: frame sent, received, parsed, views stored); the receiving thread that waits on the store awake
with them (``wake``, what ``transport_throughput.py``'s timing ends with). The marks come from wrapping the sending
endpoint's own steps and the receiver's store. Median over ``--repeats`` after two warm-ups per size. Writes
``shm_push_parts.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import measure_or_reload
from transport_throughput import recv_landed

MIB = 1 << 20
PARTS = ("handoff", "slab", "copy", "frame", "to_store", "wake", "total")
WARMUPS = 2


def _receiver(conn: Any) -> None:
    from tetriserve.transport.registry import make_transport

    endpoint = make_transport("shm", "127.0.0.1:0")
    store = endpoint.store
    put = store.put

    def timed_put(key: str, buffers: list[Any], **kw: Any) -> bool:
        stored = put(key, buffers, **kw)
        conn.send(("stored", time.perf_counter()))
        return stored

    store.put = timed_put  # type: ignore[method-assign]
    conn.send(endpoint.address)
    while (key := conn.recv()) is not None:
        buffers = recv_landed(endpoint, key)
        conn.send(("woke", time.perf_counter()))
        del buffers
    endpoint.close()


def _marked_sender() -> tuple[Any, dict[str, float]]:
    """An shm endpoint whose sending steps leave their time in the returned dict."""
    import tetriserve.transport.shm as shm
    from tetriserve.transport.registry import make_transport

    marks: dict[str, float] = {}
    attempts, take_slab, send_frame = shm.ShmTransport._send_attempts, shm.ShmTransport._take_slab, shm.send_frame

    def marked_attempts(self: Any, *args: Any) -> None:
        marks["started"] = time.perf_counter()
        attempts(self, *args)

    def marked_take_slab(self: Any, nbytes: int) -> Any:
        slab = take_slab(self, nbytes)
        marks["slab"] = time.perf_counter()
        return slab

    def marked_send_frame(*args: Any) -> None:
        marks["copied"] = time.perf_counter()
        send_frame(*args)
        marks["framed"] = time.perf_counter()

    shm.ShmTransport._send_attempts = marked_attempts  # type: ignore[method-assign]
    shm.ShmTransport._take_slab = marked_take_slab  # type: ignore[method-assign]
    shm.send_frame = marked_send_frame
    return make_transport("shm", "127.0.0.1:0"), marks


def measure(sizes: list[int], repeats: int) -> dict[str, Any]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_receiver, args=(child,), daemon=True)
    proc.start()
    address = parent.recv()
    sender, marks = _marked_sender()
    out: dict[str, dict[str, list[float]]] = {}
    try:
        for size in sizes:
            payload = bytearray(size * MIB)
            for r in range(repeats + WARMUPS):
                key = f"{size}-{r}"
                parent.send(key)
                t0 = time.perf_counter()
                handle = sender.send(address, key, [payload], 60.0)
                got = dict(parent.recv() for _ in range(2))
                handle.wait(60.0)
                if r < WARMUPS:
                    continue
                ms = {
                    "handoff": marks["started"] - t0,
                    "slab": marks["slab"] - marks["started"],
                    "copy": marks["copied"] - marks["slab"],
                    "frame": marks["framed"] - marks["copied"],
                    "to_store": got["stored"] - marks["copied"],
                    "wake": got["woke"] - got["stored"],
                    "total": got["woke"] - t0,
                }
                for part, seconds in ms.items():
                    out.setdefault(str(size), {}).setdefault(part, []).append(seconds * 1e3)
    finally:
        parent.send(None)
        proc.join(10)
        sender.close()
    return {"sizes_mib": sizes, "repeats": repeats, "ms": out}


def report(data: dict[str, Any]) -> str:
    lines = [
        "# One shm push, part by part",
        "",
        f"Command: `{data['command']}`  ",
        "One buffer pushed from one process to another on this machine (2 cores); ms from `send`, median of "
        f"{data['repeats']} repeats after {WARMUPS} warm-ups per size (see the script's docstring for each part; "
        "`frame` overlaps `to_store`, so the parts other than it add up to `total`). `GB/s`: the size over "
        "`total`, and over `copy` alone.",
        "",
        "| MiB | " + " | ".join(PARTS) + " | GB/s | copy alone GB/s |",
        "| ---: |" + " ---: |" * (len(PARTS) + 2),
    ]
    for size in data["sizes_mib"]:
        med = {part: statistics.median(data["ms"][str(size)][part]) for part in PARTS}
        gbps = [size * MIB / (med[p] / 1e3) / 1e9 for p in ("total", "copy")]
        lines.append(
            f"| {size} | " + " | ".join(f"{med[p]:.3f}" for p in PARTS) + f" | {gbps[0]:.2f} | {gbps[1]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("shm_push_parts", args.report_only, lambda: measure(args.sizes_mib, args.repeats), report)


if __name__ == "__main__":
    raise SystemExit(main())
