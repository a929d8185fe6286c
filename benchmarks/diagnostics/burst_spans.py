"""Where a burst's first seconds go: every request's tracing spans when all arrive at once.

    python benchmarks/diagnostics/burst_spans.py --num-prompts 300 --seed 1

At saturation plain vLLM has its decode batch full within about two seconds and tetriserve takes several
(the side-by-side's per-request file, ``vllm_bench_serve_per_request.json``). This runs one fresh
``tetriserve serve`` (extra ``--flags``) with tracing on, exporting OTLP/HTTP to a collector in this process,
warmed up as in ``vllm_bench_serve.py``, then vLLM's benchmark client's saturation scenario: ``--num-prompts``
ShareGPT prompts at once (``--seed``, ``--ignore-eos``). Times are seconds after the first request's root span began.

* **The ramp**: at each of ``--at`` seconds, how many requests had reached each stage: the front door
  (``tetriserve.request``), the GlobalScheduler's placement (``tetriserve.place``), the prefill worker
  (``tetriserve.prefill``), the end of their prefill (``tetriserve.prefill.compute``), the decode engine's first
  step for them done (``tetriserve.decode.first_step``: started decoding) and the end of the request; every
  column counts requests that had got that far, not those still there.
* **Per group**: requests in the order their prefill ended, cut at ``--groups``; per span name, the median
  start (and the group's earliest and latest) and the median and largest duration.

Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import PORT, URL, client_args
from ttft_spans import Collector
from vllm_bench_report import RESULTS, ROOT, WORK
from vllm_bench_serve import prepare, run_bench, stop, tetriserve_cmd, wait_ready

STAGES = (  # (ramp column, span, its start or end)
    ("at the front door", "tetriserve.request", 0),
    ("placed", "tetriserve.place", 0),
    ("at the prefill worker", "tetriserve.prefill", 0),
    ("prefilled", "tetriserve.prefill.compute", 1),
    ("started decoding", "tetriserve.decode.first_step", 1),
    ("ended", "tetriserve.request", 1),
)
EXPORT_S = 8  # the span processors export every 5 s


def requests(spans: list[tuple[str, str, int, int]]) -> list[dict[str, tuple[float, float]]]:
    """Each traced request's spans by name, (start, end) in seconds after the earliest root span began; in the
    order their prefill ended."""
    traces: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for trace, name, start, end in spans:
        traces[trace].setdefault(name, (start, end))
    done = [t for t in traces.values() if "tetriserve.request" in t and "tetriserve.prefill.compute" in t]
    t0 = min(t["tetriserve.request"][0] for t in done)
    out = [{n: ((s - t0) / 1e9, (e - t0) / 1e9) for n, (s, e) in t.items()} for t in done]
    return sorted(out, key=lambda r: r["tetriserve.prefill.compute"][1])


def ramp(reqs: list[dict[str, tuple[float, float]]], at: list[float]) -> list[dict[str, float]]:
    return [
        {"t": t, **{col: sum(1 for r in reqs if name in r and r[name][end] <= t) for col, name, end in STAGES}}
        for t in at
    ]


def groups(reqs: list[dict[str, tuple[float, float]]], cuts: list[int]) -> list[dict]:
    out = []
    for lo, hi in itertools.pairwise(cuts):
        members = reqs[lo:hi]
        if not members:
            break
        rows = {}
        for name in {n for r in members for n in r}:
            starts = [r[name][0] for r in members if name in r]
            durations = [r[name][1] - r[name][0] for r in members if name in r]
            rows[name] = {
                "n": len(starts),
                "start_median": statistics.median(starts),
                "start_first": min(starts),
                "start_last": max(starts),
                "duration_median": statistics.median(durations),
                "duration_max": max(durations),
            }
        by_start = dict(sorted(rows.items(), key=lambda kv: kv[1]["start_median"]))
        out.append({"requests": [lo, lo + len(members)], "spans": by_start})
    return out


def write(result: dict, args: argparse.Namespace) -> None:
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    client = result["client"]
    cols = [c for c, _, _ in STAGES]
    lines = [
        "# A burst's first seconds, span by span",
        "",
        f"Command: `python benchmarks/diagnostics/burst_spans.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`  ",
        f"tetriserve's defaults{' with ' + args.flags if args.flags else ''}, tracing on, warmed up as in "
        f"`vllm_bench_serve.py`; vLLM's benchmark client sent {args.num_prompts} ShareGPT prompts at once (seed "
        f"{args.seed}, `--ignore-eos`): {client['completed']:.0f} completed, {client['output_throughput']:.0f} "
        f"output tokens/s, median TTFT {client['median_ttft_ms']:.0f} ms. Times: seconds after the first "
        "request's root span began.",
        "",
        "## The ramp: requests that had reached each stage",
        "",
        "| s | " + " | ".join(cols) + " |",
        "| ---: |" + " ---: |" * len(cols),
    ]
    lines += [f"| {row['t']:g} | " + " | ".join(str(row[c]) for c in cols) + " |" for row in result["ramp"]]
    lines += ["", "## Per group of requests, in the order their prefill ended", ""]
    for group in result["groups"]:
        lo, hi = group["requests"]
        lines += [
            f"Requests {lo}–{hi - 1}:",
            "",
            "| span | n | start: median (first – last) | duration: median, largest |",
            "| --- | ---: | --- | --- |",
        ]
        for name, s in group["spans"].items():
            lines.append(
                f"| `{name}` | {s['n']} | {s['start_median']:.3f} ({s['start_first']:.3f} – {s['start_last']:.3f}) "
                f"| {s['duration_median']:.3f}, {s['duration_max']:.3f} |"
            )
        lines.append("")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def traced_scenario(
    name: str,
    scenario: str,
    flags: str,
    collector: Collector,
    bench: argparse.Namespace,
    model: str,
    dataset: Path,
    env: dict[str, str],
) -> tuple[list[tuple[str, str, int, int]], dict[str, float]]:
    """A fresh ``tetriserve serve`` (extra ``flags``) exporting its spans to ``collector``, warmed up as in
    ``vllm_bench_serve.py``, then ``scenario`` of vLLM's benchmark client: the scenario's spans (those the
    collector got after the warm-up's were exported) and the client's summary. The server's log is
    ``_work/server_<name>.log``; the collector is shut down on return."""
    cmd = tetriserve_cmd(*shlex.split(flags), "--otlp-endpoint", collector.endpoint, "--otlp-protocol", "http")
    with open(WORK / f"server_{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(URL, proc)
            run_bench(name, "warmup", PORT, bench, model, dataset)  # not measured
            time.sleep(EXPORT_S)  # the warm-up's spans exported before the scenario's are counted
            before = len(collector.spans)
            client = run_bench(name, scenario, PORT, bench, model, dataset)
            time.sleep(EXPORT_S)
        finally:
            stop(proc)
    collector.shutdown()
    return collector.spans[before:], client


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1, help="the benchmark client's seed (prompt sample)")
    ap.add_argument("--flags", default="", help="extra `tetriserve serve` flags")
    ap.add_argument("--at", type=float, nargs="+", default=[0.5, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30])
    ap.add_argument("--groups", type=int, nargs="+", default=[0, 20, 60, 120, 200, 300])
    ap.add_argument("--out", default="burst_spans")
    args = ap.parse_args()
    args.request_rate, args.single_prompts = 2.0, 50  # client_args' other scenarios' sizes, unused here
    model, dataset, env = prepare()
    bench = client_args(args)
    collector = Collector()
    spans, client = traced_scenario("burst_spans", "saturation", args.flags, collector, bench, model, dataset, env)
    reqs = requests(spans)
    result = {
        "command": sys.argv[1:],
        "client": {k: client.get(k) for k in ("completed", "output_throughput", "median_ttft_ms")},
        "ramp": ramp(reqs, args.at),
        "groups": groups(reqs, args.groups),
    }
    write(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
