"""What a same-host GPU path for KV could reach: CUDA IPC between two processes on one GPU.

    python benchmarks/gpu_ipc.py --sizes-mib 1 4 16 64 256 --repeats 10

A KV cache on a GPU is packed into pinned host memory, crosses to the other process in host memory
(``shm``: a slab; ``tcp``/``ucx``/``nccl``: their own buffers) and is copied back up to the receiving GPU
(``gpu_transport.md``: 63 ms for one 2048-token Llama-3-8B request over ``shm`` on an H100). Two processes on
one host can instead share device memory itself: the producer exports a CUDA IPC handle for a buffer, the
consumer opens it and copies GPU→GPU. This measures that path beside its alternatives, in one run:

    in-process    GPU→GPU copy of each size within one process: the ceiling
    ipc copy      the consumer copies the producer's buffer, opened once, into its own: what a transfer costs
                  once a pool of exported buffers is mapped (as ``shm`` maps each slab once per connection)
    ipc open      exporting a fresh buffer's handle and the consumer's first access to it: what a transfer
                  costs on top when each one exports a new buffer
    host staged   the producer copies GPU→pinned host→a shared-memory slab, the consumer the slab→its pinned
                  buffer→its GPU: the ``shm`` path without its socket, every host leg from pinned memory

Each cell is the median of ``--repeats`` after one warm-up. Needs a CUDA GPU: without one it says so and writes
nothing (exit 0).
Writes ``benchmarks/results/gpu_ipc.{md,json}``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import gpu_args, measure_or_reload, provenance
from gpu_transport import MIB, _timed


def _consumer(requests: Any, replies: Any) -> None:
    """The decode side: opens what the producer shares, copies it into its own memory, says how long it took."""
    import torch

    torch.cuda.init()
    while (msg := requests.get()) is not None:
        replies.put(_take(*msg))
        del msg  # the producer's buffer goes with the last reference to it


def _take(kind: str, src: Any, repeats: int) -> list[float]:
    """One request to the consumer: seconds of each timed repeat (none for ``open``, which the producer times)."""
    import torch

    dst = torch.empty_like(src, device="cuda")
    if kind == "copy":  # opened once (when src arrived), then copied repeatedly
        return _timed(lambda: dst.copy_(src, non_blocking=True), repeats)
    if kind == "open":  # the first touch of a freshly shared buffer
        dst.copy_(src)
        torch.cuda.synchronize()
        return []
    landing = torch.empty_like(src, pin_memory=True)  # staged: src is the producer's shared host slab

    def legs() -> None:
        landing.copy_(src)
        dst.copy_(landing, non_blocking=True)

    return _timed(legs, repeats)


def measure(sizes_mib: list[int], repeats: int) -> dict[str, Any]:
    import torch
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(requests, replies), daemon=True)
    proc.start()
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "sizes_mib": sizes_mib,
                           "repeats": repeats}  # fmt: skip
    try:
        for mib in sizes_mib:
            for name, times in _one_size(mib * MIB, repeats, requests, replies).items():
                out.setdefault(name, {})[str(mib)] = times  # str: as the saved JSON has it
    finally:
        requests.put(None)
        proc.join(30)
    return out


def _one_size(n: int, repeats: int, requests: Any, replies: Any) -> dict[str, list[float]]:
    """Every figure of one size of ``n`` bytes, in seconds per repeat."""
    import torch

    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    out = {"in_process": _timed(lambda: dst.copy_(src, non_blocking=True), repeats)}
    requests.put(("copy", src, repeats))
    out["ipc_copy"] = replies.get(timeout=120)
    opens = []
    for _ in range(repeats + 1):
        fresh = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        requests.put(("open", fresh, 1))
        replies.get(timeout=120)
        opens.append(time.perf_counter() - t)
        del fresh
    out["ipc_open"] = opens[1:]
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    slab = torch.empty(n, dtype=torch.uint8).share_memory_()

    def pack() -> None:  # the producer's legs of the host-staged path
        pinned.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        slab.copy_(pinned)

    out["staged_d2h"] = _timed(pack, repeats)
    requests.put(("staged", slab, repeats))
    out["host_staged"] = replies.get(timeout=120)
    return out


def _gbps(mib: int, seconds: list[float]) -> float:
    return mib * MIB / statistics.median(seconds) / 1e9


def report(data: dict[str, Any]) -> str:
    sizes = data["sizes_mib"]
    lines = [
        "# Same-host GPU KV path: CUDA IPC between two processes on one GPU",
        "",
        *provenance(data),
        f"Device: {data['device']}; torch {data['torch']}. Median of the repeats after one warm-up; GB/s of the "
        "payload. `ipc open` is per transfer from the producer's export to the consumer's copy done, the queue "
        "round trip included; `host staged` is the producer's legs (GPU→pinned→shared slab) plus the consumer's "
        "(slab→pinned→GPU).",
        "",
        "| MiB | in-process GPU→GPU GB/s | IPC copy GB/s | IPC open + copy ms | host staged ms | host staged GB/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mib in sizes:
        key = str(mib)
        staged = [a + b for a, b in zip(data["staged_d2h"][key], data["host_staged"][key], strict=True)]
        lines.append(
            f"| {mib} | {_gbps(mib, data['in_process'][key]):.1f} | {_gbps(mib, data['ipc_copy'][key]):.1f} | "
            f"{1000 * statistics.median(data['ipc_open'][key]):.2f} | {1000 * statistics.median(staged):.2f} | "
            f"{_gbps(mib, staged):.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    args = gpu_args(__doc__, "gpu_ipc")
    if args is None:
        return 0
    return measure_or_reload("gpu_ipc", args.report_only, lambda: measure(args.sizes_mib, args.repeats), report)


if __name__ == "__main__":
    sys.exit(main())
