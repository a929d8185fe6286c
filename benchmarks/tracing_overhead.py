"""What tracing costs a request when it is off (the default), and when it is on, in-process.

    python benchmarks/tracing_overhead.py [--out benchmarks/results/tracing_overhead.md]

Per request: every tracing call one request's path makes across all its processes (the front door's root
span, the placement span, the prefill worker's five spans, the decode worker's three and the KV load's),
timed in one process (the ``Request`` objects are built beforehand; the placement message is not). Per
token: the decode worker's delta callback with its request id bound for the log lines
(``log_context.within``), against the bare callback. On means spans recorded by the SDK and handed to a
no-op exporter (``SimpleSpanProcessor``; in service the BatchSpanProcessor exports on its own thread).
A micro-benchmark of our calls, not of a served request: it says whether the off path is negligible, not
what a trace costs end to end. Numbers vary with the machine and its load. Writes the table to ``--out``
(``benchmarks/results/tracing_overhead.md`` by default) and its figures beside it (``.json``); about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import RESULTS, provenance, run_facts
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tetriserve.common import log_context
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.stream import Placement, PlacementRequest
from tetriserve.common.tracing_config import TracingConfig
from tetriserve.control_plane.global_scheduler import trace_placement
from tetriserve.decode_worker.spans import DecodeSpans
from tetriserve.observability import tracing
from tetriserve.observability.request_span import RequestSpan
from tetriserve.prefill_worker import spans as prefill_spans

HEADER = """Per request, every tracing call of one request's path (all its processes' calls, timed in one process);
per token, the request id bound around each decode delta callback for its log lines. A micro-benchmark on one
machine, shared with whatever else runs on it, so only the orders of magnitude matter: compare the per-request
cost with the milliseconds a request spends in the engines.

"""
ESTIMATE = LengthEstimate(8, 16, 32, 1, 0.9, "baseline")


class _Drop(SpanExporter):
    def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS


def one_request(req: Request, placement: Placement) -> None:
    """Every tracing call of one request's path (front door, GlobalScheduler, prefill, decode, KV load)."""
    root = RequestSpan(req, "tiny-llama", "POST /v1/completions", time.monotonic())
    started = tracing.now_ns()
    trace_placement(PlacementRequest(req.request_id, 4, 8, 0.0, trace=req.trace), placement, started)
    span = prefill_spans.open_prefill("prefill-0", req)
    queued = tracing.now_ns()
    prefill_spans.computed(prefill_spans.queued(queued, 1), (7,), None)
    prefill_spans.predicted(queued, ESTIMATE, late=False)
    sends: dict[str, tracing.Span] = {}
    prefill_spans.sending(sends, req.kv_key, tracing.now_ns(), 1 << 20, "tcp://127.0.0.1:1", "decode-0")
    tracing.annotate({"tetriserve.decode_worker": "decode-0", "tetriserve.dispatch": "power-of-two"})
    tracing.end(sends.pop(req.kv_key, tracing.INVALID_SPAN), error=None)
    tracing.end(span)
    decode = DecodeSpans.open("decode-0", req, 1)
    tracing.link_key(req.kv_key, decode.span)
    parent = tracing.key_parent(req.kv_key)
    if parent is not None:
        tracing.record("tetriserve.kv.load", parent, tracing.now_ns(), {"tetriserve.kv.bytes": 1 << 20})
    decode.first_token()
    decode.close(8, "length", None)
    root.finished("length", None, 1.0)
    root.close(8)


def per_request_us(n: int) -> float:
    requests = [Request(f"r{i}", (1, 2, 3, 4), SamplingSpec(max_tokens=8)) for i in range(n)]
    placement = Placement("r", "prefill-0")

    async def run() -> float:  # in a task, as the workers' per-request tasks are
        t0 = time.perf_counter()
        for req in requests:
            one_request(req, placement)
        return (time.perf_counter() - t0) / n * 1e6

    return asyncio.run(run())


def per_token_ns(n: int) -> tuple[float, float]:
    """(bare callback, callback with the request id bound), ns per call."""

    def on_delta(run: object, delta: int) -> None:
        return None

    bare = functools.partial(on_delta, object())
    bound = log_context.within("r1", None, bare)
    return _ns(bare, n), _ns(bound, n)


def _ns(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e9


def best(fn: Callable[[], float], repeat: int = 5) -> float:
    return min(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(RESULTS / "tracing_overhead.md"), help="the report (.md)")
    args = parser.parse_args()
    facts = run_facts()
    tracing.setup(TracingConfig(), "bench")
    off = best(lambda: per_request_us(args.requests))
    bare, bound = (statistics.median(x) for x in zip(*(per_token_ns(args.tokens) for _ in range(5)), strict=True))
    tracing.setup(TracingConfig(enabled=True), "bench", _Drop())
    on = best(lambda: per_request_us(args.requests // 10))
    tracing.shutdown()
    table = "\n".join(
        [
            "| what | cost |",
            "| --- | --- |",
            f"| one request's tracing calls, tracing off (default) | {off:.2f} µs |",
            f"| one request's tracing calls, tracing on (11 spans, SDK with a no-op exporter) | {on:.1f} µs |",
            f"| per token: decode delta callback, bare | {bare:.0f} ns |",
            f"| per token: the same with the request id bound for log lines | {bound:.0f} ns |",
        ]
    )
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = "\n".join(["# Tracing overhead", "", *provenance(facts), "", ""])
    out.write_text(head + HEADER + table + "\n")
    figures = {"per_request_off_us": off, "per_request_on_us": on}
    figures |= {"per_token_bare_ns": bare, "per_token_bound_ns": bound}
    out.with_suffix(".json").write_text(json.dumps({**facts, "args": vars(args), **figures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
