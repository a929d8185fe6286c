"""Where a request's first token goes: its tracing spans, per stage, one stream at a time.

    python benchmarks/diagnostics/ttft_spans.py --requests 40 \
        --variant process= --variant thread="--config benchmarks/diagnostics/predictor_in_thread.yaml"

Each ``--variant NAME=FLAGS`` runs on a fresh ``tetriserve serve`` (extra ``FLAGS``) with tracing on, exporting
OTLP/HTTP to a collector in this process. One client sends ``--requests`` streamed completions one after the
other (``--prompt-words`` words, ``--max-tokens`` tokens, ``ignore_eos``, ``--gap-s`` apart), so every stage is
seen without a queue in front of it. For every span name the report gives the median start after the request's
root span began and the median duration (ms), over the requests after the first ``--skip``, and the client's own
median TTFT, and what the prefill engine did for a request: its steps and their wall time, from the worker's
``tetriserve:engine_steps_total`` and ``engine_step_seconds_total`` read around the same requests (with
``--max-tokens 1`` the request ends at the prefill, so nothing else runs). With ``--code NAME=COMMIT`` variant
``NAME``'s server runs the code of ``COMMIT`` (``variant_envs``). Writes
``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import worker_series
from vllm_bench_report import RESULTS, ROOT, WORK, add_code_option, code_line, variant_envs
from vllm_bench_serve import prepare, stop, tetriserve_cmd, wait_ready

PORT = 8100  # tetriserve_cmd's HTTP port
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then", "runs", "far", "away")


class Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span it is sent, as (trace, name, start ns, end ns)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, int, int]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def keep(self, span: Any) -> None:
        """Keep one received span (an OTLP ``Span``); called with ``lock`` held."""
        self.spans.append((span.trace_id.hex(), span.name, span.start_time_unix_nano, span.end_time_unix_nano))


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.server.lock:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.server.keep(s)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


def one_request(i: int, words: int, max_tokens: int) -> float:
    """Stream one completion; the client's TTFT in ms."""
    rng = random.Random(i)
    body = {
        "model": "tiny-llama",
        "prompt": " ".join(rng.choice(WORDS) for _ in range(words)),
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            if first is None and line.startswith(b"data: ") and b"[DONE]" not in line:
                first = time.perf_counter()
    assert first is not None, "no chunk came back"
    return (first - t0) * 1e3


def prefill_engine() -> tuple[float, float]:
    """The prefill engines' (steps, wall seconds in steps) so far, from the front door's ``/metrics``."""
    counters = worker_series(role="prefill").items()
    steps = sum(v for (series, _, _), v in counters if series == "engine_steps")
    seconds = sum(v for (series, _, clock), v in counters if series == "engine_step_seconds" and clock == "wall")
    return steps, seconds


def breakdown(spans: list[tuple[str, str, int, int]], skip: int) -> dict[str, dict[str, float]]:
    """Per span name: median start after its trace's root began, median duration (ms), and how many."""
    traces: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for trace, name, start, end in spans:
        traces[trace].append((name, start, end))
    ordered = sorted(traces.values(), key=lambda ss: min(s[1] for s in ss))[skip:]
    starts: dict[str, list[float]] = defaultdict(list)
    durations: dict[str, list[float]] = defaultdict(list)
    for ss in ordered:
        root = min(s[1] for s in ss)
        for name, start, end in ss:
            starts[name].append((start - root) / 1e6)
            durations[name].append((end - start) / 1e6)
    rows = {
        name: {"start_ms": statistics.median(v), "duration_ms": statistics.median(durations[name]), "n": len(v)}
        for name, v in starts.items()
    }
    return dict(sorted(rows.items(), key=lambda kv: kv[1]["start_ms"]))


def run_variant(name: str, flags: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    collector = Collector()
    cmd = tetriserve_cmd(*flags.split(), "--otlp-endpoint", collector.endpoint, "--otlp-protocol", "http")
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / f"ttft_spans_{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{PORT}", proc)
            ttfts = []
            for i in range(args.requests):
                if i == args.skip:
                    engine_before = prefill_engine()
                ttfts.append(one_request(i, args.prompt_words, args.max_tokens))
                time.sleep(args.gap_s)
            steps, seconds = (after - before for after, before in zip(prefill_engine(), engine_before, strict=True))
            time.sleep(8)  # the span processors export every 5 s
        finally:
            stop(proc)
    collector.shutdown()
    return {
        "flags": flags,
        "client_ttft_ms": statistics.median(ttfts[args.skip :]),
        "prefill_steps_per_request": steps / (args.requests - args.skip),
        "prefill_step_ms_per_request": 1e3 * seconds / (args.requests - args.skip),
        "spans": breakdown(collector.spans, args.skip),
    }


def write(results: dict[str, Any], args: argparse.Namespace) -> Path:
    out = RESULTS / f"{args.out}.md"
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# A request's first token, stage by stage: its tracing spans, one stream at a time",
        "",
        f"Command: `python benchmarks/diagnostics/ttft_spans.py {' '.join(sys.argv[1:])}`  ",
        code_line(args),
        f"{args.requests} streamed completions one after the other ({args.prompt_words}-word prompts, "
        f"{args.max_tokens} tokens, {args.gap_s:g} s apart), each variant on a fresh `tetriserve serve` with tracing "
        f"on; medians over all but the first {args.skip}. Start: ms after the request's root span began (the "
        "front door's receipt of it). Machine: 2 CPU cores, tiny random-weight Llama.",
        "",
    ]
    names = list(results)
    spans = list(dict.fromkeys(s for r in results.values() for s in r["spans"]))
    lines.append("| span | " + " | ".join(f"{n}: start | {n}: duration" for n in names) + " |")
    lines.append("| --- |" + " ---: | ---: |" * len(names))
    for span in spans:
        cells = []
        for n in names:
            row = results[n]["spans"].get(span)
            cells += [f"{row['start_ms']:.2f}", f"{row['duration_ms']:.2f}"] if row else ["-", "-"]
        lines.append(f"| `{span}` | " + " | ".join(cells) + " |")
    lines.append("| client's TTFT | " + " | ".join(f"{results[n]['client_ttft_ms']:.2f} | " for n in names) + "|")
    for key, label in (("prefill_steps_per_request", "prefill engine: steps a request (mean)"),
                       ("prefill_step_ms_per_request", "prefill engine: ms in steps a request (mean)")):  # fmt: skip
        if all(key in results[n] for n in names):
            lines.append(f"| {label} | " + " | ".join(f"{results[n][key]:.2f} | " for n in names) + "|")
    lines += ["", "Variants: " + "; ".join(f"`{n}`: `serve {results[n]['flags'] or '(defaults)'}`" for n in names), ""]
    out.write_text("\n".join(lines))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="NAME=FLAGS: extra `tetriserve serve` flags")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--skip", type=int, default=3, help="first requests left out (warm-up)")
    ap.add_argument("--prompt-words", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gap-s", type=float, default=0.1, help="pause between requests")
    add_code_option(ap)
    ap.add_argument("--out", default="ttft_spans")
    args = ap.parse_args()
    if args.requests <= args.skip:
        ap.error("--requests must be more than --skip")
    variants = [v.split("=", 1) for v in (args.variant or ["defaults="])]
    envs = variant_envs(args, (name for name, _ in variants), prepare()[2])
    results = {name: run_variant(name, flags, args, envs[name]) for name, flags in variants}
    print(write(results, args).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
