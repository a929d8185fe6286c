"""KV transport figures on a GPU, on a machine with a CUDA GPU.

    python benchmarks/gpu_transport.py --sizes-mib 1 4 16 64 256 --repeats 10

Measured in one run, each a median over the repeats after one warm-up per size:

    copies    raw CUDA copies of each size: host→GPU and GPU→host from pageable memory (what ``torch``'s
              ``.to(device)``/``.cpu()`` of a ``frombuffer`` tensor does: the nccl backend's staging legs) and
              from pinned memory, and GPU→GPU
    nccl raw  raw ``torch.distributed`` NCCL send/recv between two processes on a two-rank group built over a
              TCPStore as the nccl backend builds its pairs, a one-byte tensor back as the ack. On a machine with
              one GPU both ranks share it, which NCCL may refuse; the error is recorded then
    nccl      the ``nccl`` backend itself between two processes, host buffers in and out (as transport_throughput)
    nccl self one process, a one-rank NCCL group sending to itself (``batch_isend_irecv``): NCCL's point-to-point
              path on one GPU, for when two ranks cannot share it
    kv pack   ``kv_codec.pack`` (pinned, and into pageable memory) and ``unpack_into`` (from pageable buffers,
              and from pinned ones) of one request's blocks on a GPU KV cache of a Llama-3-8B shape (32 layers,
              8 KV heads of 128, bf16, blocks of 16 tokens, vLLM's GPU layout
              ``[2, num_blocks, block_size, heads, head_dim]``): the cost the engine step pays per request
    handoff   one 2048-token request from one GPU cache to another over ``tcp`` (landing buffers pinned, and
              pageable) and ``shm``, timed leg by leg: pack, send until the receiver holds it, unpack

Needs a CUDA GPU: without one it says so and writes nothing (exit 0). Writes
``benchmarks/results/gpu_transport.{md,json}``; a line per part as it is done.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import gpu_args, measure_or_reload, provenance
from transport_throughput import MIB, _backend, exchange, free_port

LLAMA8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "block_size": 16}
PACK_TOKENS = (512, 2048, 8192)
HANDOFF_TOKENS = 2048


def _timed(fn: Any, repeats: int) -> list[float]:
    import torch

    out = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if r:
            out.append(time.perf_counter() - t0)
    return out


def _copies(sizes: list[int], repeats: int) -> dict[str, dict[int, list[float]]]:
    import torch

    out: dict[str, dict[int, list[float]]] = {}
    for size in sizes:
        n = size * MIB
        gpu, gpu2 = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
        pageable = torch.frombuffer(bytearray(n), dtype=torch.uint8)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        legs = {  # (destination, source)
            "h2d_pageable": (gpu, pageable),
            "h2d_pinned": (gpu, pinned),
            "d2h_pageable": (pageable, gpu),
            "d2h_pinned": (pinned, gpu),
            "d2d": (gpu2, gpu),
        }
        for name, (dst, src) in legs.items():
            seconds = _timed(lambda dst=dst, src=src: dst.copy_(src, non_blocking=True), repeats)
            out.setdefault(name, {})[size] = [n / s / 1e9 for s in seconds]
    return out


def _failure(exc: BaseException) -> dict[str, str]:
    """A measurement that could not run, as recorded (on one GPU NCCL refuses two ranks on the same device)."""
    return {"error": f"{type(exc).__name__}: {exc}".strip()[:600], "trace": traceback.format_exc()[-2000:]}


def _collect(target: Any, args_each: list[tuple[Any, ...]], timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Run ``target(*args, conn)`` in a spawned process for each ``args``; what each sent back, or a hang."""
    ctx, deadline = mp.get_context("spawn"), time.monotonic() + timeout_s
    pipes = [mp.Pipe() for _ in args_each]
    children = [child for _, child in pipes]
    procs = [ctx.Process(target=target, args=(*a, c), daemon=True) for a, c in zip(args_each, children, strict=True)]
    for proc in procs:
        proc.start()
    results = []
    for (parent, _), proc in zip(pipes, procs, strict=True):
        hung = not parent.poll(max(deadline - time.monotonic(), 0.0))
        results.append({"error": f"no answer in {timeout_s:.0f} s (hung)"} if hung else parent.recv())
        if proc.is_alive():
            proc.kill()
    return results


def _nccl_rank(rank: int, port: int, sizes: list[int], repeats: int, conn: Any) -> None:
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60), wait_for_workers=False)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=60)
        group = dist.ProcessGroupNCCL(store, rank, 2, options)
        ack = torch.ones(1, dtype=torch.uint8, device="cuda")
        out: dict[int, list[float]] = {}
        for size in sizes:
            payload = torch.empty(size * MIB, dtype=torch.uint8, device="cuda")
            for r in range(repeats + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                exchange(group, rank, payload, ack)
                torch.cuda.synchronize()
                if r:
                    out.setdefault(size, []).append(size * MIB / (time.perf_counter() - t0) / 1e9)
        conn.send({"gbps": out})
    except Exception as exc:
        conn.send(_failure(exc))


def _nccl_raw(sizes: list[int], repeats: int) -> dict[str, Any]:
    port = free_port()
    results = _collect(_nccl_rank, [(rank, port, sizes, repeats) for rank in range(2)])
    errors = [r["error"] for r in results if "error" in r]
    return {"error": " | ".join(errors), "trace": results[0].get("trace", "")} if errors else results[0]


def _nccl_self_proc(sizes: list[int], repeats: int, port: int, conn: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        out: dict[int, list[float]] = {}
        for size in sizes:
            src = torch.empty(size * MIB, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)

            def step(src: Any = src, dst: Any = dst) -> None:
                ops = [dist.P2POp(dist.isend, src, 0), dist.P2POp(dist.irecv, dst, 0)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()

            out[size] = [size * MIB / s / 1e9 for s in _timed(step, repeats)]
        dist.destroy_process_group()
        conn.send({"gbps": out})
    except Exception as exc:
        conn.send(_failure(exc))


def _nccl_self(sizes: list[int], repeats: int) -> dict[str, Any]:
    return _collect(_nccl_self_proc, [(sizes, repeats, free_port())])[0]


def _nccl_backend(sizes: list[int], repeats: int, raw: dict[str, Any]) -> dict[str, Any]:
    if "error" in raw:  # the backend builds the same two-rank group: it would fail the same way, after its deadline
        return {"error": "not run: raw NCCL between two processes failed on this machine"}
    try:
        return {"gbps": _backend("nccl", sizes, repeats)}
    except BaseException as exc:  # an AssertionError carries the handle's error
        return _failure(exc)


def _kv_pack(repeats: int) -> dict[str, Any]:
    from tetriserve.transport.kv_codec import pack, unpack_into

    bs = LLAMA8B["block_size"]
    cache = _gpu_cache(max(PACK_TOKENS) // bs * 2)
    out: dict[str, Any] = {}
    for tokens in PACK_TOKENS:
        n = tokens // bs
        src_ids, dst_ids = list(range(0, 2 * n, 2)), list(range(1, 2 * n, 2))  # scattered, as block tables are
        packed = pack(cache, 1, src_ids, tokens, bs)
        received = [bytearray(b) for b in packed.buffers]  # pageable, as a transport's landing area
        out[str(tokens)] = {
            "mib": packed.nbytes / MIB,
            "pinned": packed.pinned,
            "pack_s": _timed(lambda: pack(cache, 1, src_ids, tokens, bs), repeats),  # noqa: B023
            "pack_pageable_s": _timed(lambda: pack(cache, 1, src_ids, tokens, bs, pinned=False), repeats),  # noqa: B023
            "unpack_s": _timed(lambda: unpack_into(cache, 1, dst_ids, received), repeats),  # noqa: B023
            # from page-locked buffers, as from a landing area registered with CUDA
            "unpack_pinned_s": _timed(lambda: unpack_into(cache, 1, dst_ids, packed.buffers), repeats),  # noqa: B023
        }
    return out


def _gpu_cache(num_blocks: int) -> dict[str, Any]:
    import torch

    bs, heads, hd = LLAMA8B["block_size"], LLAMA8B["kv_heads"], LLAMA8B["head_dim"]
    layout = (2, num_blocks, bs, heads, hd)  # vLLM's GPU layout: blocks on dimension 1
    return {
        f"model.layers.{i}.self_attn.attn": torch.randn(layout, dtype=torch.bfloat16, device="cuda")
        for i in range(LLAMA8B["layers"])
    }


def _handoff(repeats: int, tokens: int = HANDOFF_TOKENS) -> dict[str, Any]:
    """One request's KV from one GPU cache to another through a backend, timed leg by leg as the engines pay it:
    pack (prefill step), send until the receiver holds it, unpack (decode step). Both endpoints in this process,
    both caches on the one GPU; ``landing`` says whether the receiving backend's landing buffers were pinned."""
    import torch

    from tetriserve.transport.api import TransferState
    from tetriserve.transport.kv_codec import pack, unpack_into
    from tetriserve.transport.registry import make_transport

    bs, n = LLAMA8B["block_size"], tokens // LLAMA8B["block_size"]
    src, dst = _gpu_cache(n), _gpu_cache(n)
    ids = list(range(n))[::-1]
    out: dict[str, Any] = {}
    for kind, pinned_landing in (("tcp", True), ("tcp", False), ("shm", None)):
        tx, rx = make_transport(kind, "127.0.0.1:0"), make_transport(kind, "127.0.0.1:0")
        if pinned_landing is not None:
            rx._landing.pinned = pinned_landing  # the row before pinned landing
        legs: dict[str, list[float]] = {"pack_s": [], "send_s": [], "unpack_s": []}
        try:
            for r in range(repeats + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                packed = pack(src, 1, ids, tokens, bs)
                t1 = time.perf_counter()
                handle = tx.send(rx.address, f"k{r}", packed.buffers, 60.0)
                while (bufs := rx.recv(f"k{r}")) is None:
                    time.sleep(0.0001)
                t2 = time.perf_counter()
                unpack_into(dst, 1, ids, bufs)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                assert handle.wait(60.0) is TransferState.DONE, handle.error
                nbytes = packed.nbytes
                del bufs, packed
                if r:
                    for leg, seconds in zip(legs, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                        legs[leg].append(seconds)
        finally:
            tx.close()
            rx.close()
        name = kind if pinned_landing is None else f"{kind}, landing {'pinned' if pinned_landing else 'pageable'}"
        out[name] = {"mib": nbytes / MIB, **legs}
    return out


def _med(runs: dict[Any, list[float]]) -> dict[int, float]:
    return {int(k): statistics.median(v) for k, v in runs.items()}


def report(data: dict[str, Any]) -> str:
    sizes = data["sizes_mib"]
    lines = [
        "# KV transport on a GPU: raw CUDA copies, NCCL, KV pack/unpack",
        "",
        *provenance(data),
        f"Device: {data['device']}; torch {data['torch']}, NCCL {data['nccl']}. Median of the repeats after one "
        "warm-up per size; GB/s of the payload (not counting read and write twice).",
        "",
        "## Raw CUDA copies (GB/s)",
        "",
        "| MiB | host→GPU pageable | host→GPU pinned | GPU→host pageable | GPU→host pinned | GPU→GPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    c = {k: _med(v) for k, v in data["copies"].items()}
    for s in sizes:
        row = [c[k][s] for k in ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "d2d")]
        lines.append(f"| {s} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    lines += ["", "## NCCL (GB/s)", ""]
    rows = (
        ("nccl_raw", "raw NCCL send/recv, two processes"),
        ("nccl_backend", "the `nccl` backend, two processes, host buffers in and out"),
        ("nccl_self", "NCCL send to self, one process, one-rank group"),
    )
    ok = [(k, label) for k, label in rows if "gbps" in data[k]]
    for k, label in rows:
        if "error" in data[k]:
            lines.append(f"- {label}: **failed**: `{' '.join(data[k]['error'].split())[:300]}`")
    if ok:
        lines += ["", "| MiB | " + " | ".join(label for _, label in ok) + " |", "| ---: |" + " ---: |" * len(ok)]
        meds = {k: _med(data[k]["gbps"]) for k, _ in ok}
        for s in sizes:
            lines.append(f"| {s} | " + " | ".join(f"{meds[k][s]:.1f}" for k, _ in ok) + " |")
    shape = data["kv_shape"]
    lines += [
        "",
        f"## KV pack and unpack on the GPU ({shape['layers']} layers, {shape['kv_heads']} KV heads of "
        f"{shape['head_dim']}, bf16, blocks of {shape['block_size']})",
        "",
        "`kv_codec.pack` (gather the request's blocks, copy each layer to host memory) and `unpack_into` (each "
        "layer to the GPU, scatter into the blocks): the work the engine step does per request. `pack` as it is "
        "(pinned host memory from a GPU cache) beside `pack(pinned=False)`, into pageable memory; "
        "`unpack_into` from pageable buffers (as the transports' landing areas are) and from pinned ones.",
        "",
        "| prompt tokens | MiB | pack ms | pack GB/s | pageable pack ms | pageable pack GB/s | unpack ms | "
        "unpack GB/s | unpack from pinned ms | unpack from pinned GB/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tokens, r in data["kv_pack"].items():
        gb = r["mib"] * MIB / 1e9
        cells = [f"{tokens}", f"{r['mib']:.0f}"]
        for key in ("pack_s", "pack_pageable_s", "unpack_s", "unpack_pinned_s"):
            t = statistics.median(r[key])
            cells += [f"{t * 1e3:.1f}", f"{gb / t:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## One request's KV handed from one GPU cache to another ({HANDOFF_TOKENS} tokens, same shape)",
        "",
        "Both endpoints in one process, both caches on the one GPU: `pack` (the prefill engine's step), `send` until "
        "the receiving endpoint holds it, `unpack_into` (the decode engine's step); the tcp backend with its landing "
        "buffers pinned (the default on a host that sees a GPU) and pageable, and shm (the receiver "
        "reads the sender's slab, pageable).",
        "",
        "| backend | MiB | pack ms | send ms | unpack ms | total ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in data["handoff"].items():
        legs = [statistics.median(r[k]) * 1e3 for k in ("pack_s", "send_s", "unpack_s")]
        lines.append(f"| {name} | {r['mib']:.0f} | " + " | ".join(f"{v:.1f}" for v in [*legs, sum(legs)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    args = gpu_args(__doc__, "gpu_transport")
    if args is None:
        return 0

    def measure() -> dict[str, Any]:
        import torch
        import torch.cuda.nccl as nccl

        sizes, n = args.sizes_mib, args.repeats
        data: dict[str, Any] = {
            "sizes_mib": sizes,
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "nccl": ".".join(map(str, nccl.version())),
            "kv_shape": LLAMA8B,
        }
        for name, fn in (
            ("copies", lambda: _copies(sizes, n)),
            ("kv_pack", lambda: _kv_pack(n)),
            ("handoff", lambda: _handoff(n)),
            ("nccl_raw", lambda: _nccl_raw(sizes, n)),
            ("nccl_backend", lambda: _nccl_backend(sizes, n, data["nccl_raw"])),
            ("nccl_self", lambda: _nccl_self(sizes, n)),
        ):
            t0 = time.perf_counter()
            data[name] = fn()
            print(f"gpu_transport: {name} in {time.perf_counter() - t0:.1f} s: {str(data[name])[:300]}", flush=True)
        return data

    return measure_or_reload("gpu_transport", args.report_only, measure, report)


if __name__ == "__main__":
    raise SystemExit(main())
