"""Where a first token goes under Poisson arrivals: every request's tracing spans, by prompt length.

    python benchmarks/diagnostics/rate_spans.py --num-prompts 200 --request-rate 2.0 --seed 0

``ttft_spans.py`` times the stages one request at a time, with nothing else running; at 2 req/s the stages share
the cores with the decode of earlier requests. This runs one fresh ``tetriserve serve`` (extra ``--flags``) with
tracing on, exporting OTLP/HTTP to a collector in this process, warmed up as in ``vllm_bench_serve.py``, then
vLLM's benchmark client's ``rate`` scenario (``--num-prompts`` ShareGPT prompts, Poisson at ``--request-rate``,
``--seed``, ``--ignore-eos``). For each span name and each prompt-length band of ``vllm_bench_report.py`` (by the
root span's ``gen_ai.usage.input_tokens``) the report gives the median start, in ms after the request's root span
began (the front door's receipt of it), and the median duration, beside the client's median TTFT in the same
band. Tracing costs time itself: the client's TTFT here is above an untraced run's, so the spans say where the
time goes, not how much there is. Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from burst_spans import traced_scenario
from engine_steps import client_args
from ttft_spans import Collector
from vllm_bench_report import PROMPT_BANDS, RESULTS, band_label, code_state, ttft_by_prompt
from vllm_bench_serve import prepare

ROOT_SPAN, INPUT_TOKENS = "tetriserve.request", "gen_ai.usage.input_tokens"


class PromptCollector(Collector):
    """``Collector`` that also keeps each trace's prompt length (its root span's ``INPUT_TOKENS``)."""

    def __init__(self) -> None:
        self.prompt_tokens: dict[str, int] = {}
        super().__init__()

    def keep(self, span: Any) -> None:
        super().keep(span)
        if span.name == ROOT_SPAN:
            for kv in span.attributes:
                if kv.key == INPUT_TOKENS:
                    self.prompt_tokens[span.trace_id.hex()] = kv.value.int_value


def band_of(tokens: int) -> str:
    return band_label(*next(b for b in PROMPT_BANDS if b[0] <= tokens < b[1]))


def by_band(spans: list[tuple[str, str, int, int]], prompt_tokens: dict[str, int]) -> dict[str, dict[str, Any]]:
    """band (and ``all``) -> span name -> n, median start after its root span began, median duration (ms)."""
    traces: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for trace, name, start, end in spans:
        traces[trace].setdefault(name, (start, end))
    rows: dict[str, dict[str, tuple[list[float], list[float]]]] = defaultdict(lambda: defaultdict(lambda: ([], [])))
    for trace, named in traces.items():
        if ROOT_SPAN not in named or trace not in prompt_tokens:
            continue
        t0 = named[ROOT_SPAN][0]
        for band in ("all", band_of(prompt_tokens[trace])):
            for name, (start, end) in named.items():
                rows[band][name][0].append((start - t0) / 1e6)
                rows[band][name][1].append((end - start) / 1e6)
    return {
        band: {
            name: {"n": len(st), "start_ms": statistics.median(st), "duration_ms": statistics.median(du)}
            for name, (st, du) in sorted(named.items(), key=lambda kv: statistics.median(kv[1][0]))
        }
        for band, named in rows.items()
    }


def write(result: dict[str, Any], args: argparse.Namespace) -> None:
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    bands = ["all", *(band_label(lo, hi) for lo, hi in PROMPT_BANDS)]
    spans, client = result["spans"], result["client_median_ttft_ms"]
    lines = [
        "# A request's first token under Poisson arrivals, span by span",
        "",
        f"Command: `python benchmarks/diagnostics/rate_spans.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`  ",
        f"Code: {result['code']}  ",
        f"tetriserve's defaults{' with ' + args.flags if args.flags else ''}, tracing on, warmed up as in "
        f"`vllm_bench_serve.py`; vLLM's benchmark client sent {args.num_prompts} ShareGPT prompts, Poisson at "
        f"{args.request_rate:g} req/s (seed {args.seed}, `--ignore-eos`). Each cell: the median start, in ms after "
        "the request's root span began (the front door's receipt), and after `+` the median duration, over the "
        "requests of the column's prompt band (prompt tokens) that have the span. Tracing costs time itself.",
        "",
        "| span | "
        + " | ".join(f"{b} ({spans.get(b, {}).get('tetriserve.request', {}).get('n', 0)})" for b in bands)
        + " |",
        "| --- |" + " ---: |" * len(bands),
        "| client's median TTFT | " + " | ".join(f"{client[b]:.1f}" if b in client else "-" for b in bands) + " |",
    ]
    for name in spans.get("all", {}):
        cells = []
        for b in bands:
            s = spans.get(b, {}).get(name)
            cells.append(f"{s['start_ms']:.1f} + {s['duration_ms']:.1f}" if s else "-")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0, help="the benchmark client's seed (prompt sample, arrivals)")
    ap.add_argument("--flags", default="", help="extra `tetriserve serve` flags")
    ap.add_argument("--out", default="rate_spans")
    args = ap.parse_args()
    args.single_prompts = 50  # client_args' other scenario's size, unused here
    model, dataset, env = prepare()
    bench = client_args(args)
    collector = PromptCollector()
    spans, client = traced_scenario("rate_spans", "rate", args.flags, collector, bench, model, dataset, env)
    by_prompt = zip(PROMPT_BANDS, ttft_by_prompt(["rate_spans"], "rate"), strict=True)
    result = {
        "command": sys.argv[1:],
        "code": code_state(),
        "client_median_ttft_ms": {
            "all": client["median_ttft_ms"],
            **{band_label(*band): ms for band, (n, ms) in by_prompt if n},
        },
        "spans": by_band(spans, collector.prompt_tokens),
    }
    write(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
