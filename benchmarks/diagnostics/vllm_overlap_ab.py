"""What plain vLLM's server gains from overlapping its engine core with its model worker.

    python benchmarks/diagnostics/vllm_overlap_ab.py --scenarios single rate --repeats 2

Plain vLLM's OpenAI server runs its engine core (scheduler, output handling) and its model worker in separate
processes and overlaps them: with async scheduling the core schedules the next step while the worker runs this
one. A tetriserve engine steps in one thread, one step after the other. This runs the plain server as
``vllm_bench_serve.py`` does (same model, KV size, threads, warm-up and client) in two variants, alternating from
one repeat to the next: ``overlap`` (vLLM's defaults) and ``no_overlap`` (``--no-async-scheduling``). On CPU vLLM
keeps its model worker in a process of its own either way (its CPU platform takes the multiprocess executor even
when ``--distributed-executor-backend uni`` is asked for), so the pair isolates the overlap, which is what giving
tetriserve's engines such a split could gain. Writes ``<--out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import RESULTS, SCENARIOS
from vllm_bench_serve import prepare, serve_and_bench, vllm_server

VARIANTS = {"overlap": [], "no_overlap": ["--no-async-scheduling"]}
FIGURES = ("completed", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_per_token_ms",
           "output_throughput", "cpu_cores")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=["single", "rate"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--single-prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="vllm_overlap_ab")
    args = ap.parse_args()
    args.ignore_eos = True  # as vllm_bench_serve.py's default: every request generates its dataset length
    model, dataset, env = prepare()
    cmd, venv = vllm_server(model, 8101, env)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {s: {v: [] for v in VARIANTS} for s in args.scenarios}
    for rep in range(args.repeats):
        order = list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]
        for scenario in args.scenarios:
            for v in order:
                print(f"== repeat {rep + 1}/{args.repeats}: {scenario}, {v}", flush=True)
                server = [*cmd, *VARIANTS[v]]
                runs[scenario][v].append(
                    serve_and_bench(f"overlap_ab_{v}", server, 8101, venv, args, model, dataset, scenario)
                )
    command = "python benchmarks/diagnostics/vllm_overlap_ab.py " + " ".join(sys.argv[1:])
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    lines = [
        "# Plain vLLM's server with and without async scheduling (its engine core overlapping its model worker)",
        "",
        f"Command: `{command}`  ",
        "vLLM's benchmark client (ShareGPT, seed 0, `--ignore-eos`) against a fresh plain vLLM server per run, set "
        "up as in `vllm_bench_serve.py`; `overlap`: vLLM's defaults (async scheduling: the engine core schedules the "
        "next step while the model worker, a process of its own, runs this one); `no_overlap`: "
        "`--no-async-scheduling`. Variants alternate from one repeat to the next. Each cell: the median over "
        "repeats (each repeat's value after it).",
    ]
    for scenario, by_variant in runs.items():
        lines += ["", f"## {scenario}", "", "| figure | overlap | no_overlap | no_overlap / overlap |"]
        lines.append("| --- | ---: | ---: | ---: |")
        for fig in FIGURES:
            cells = [[r[fig] for r in by_variant[v] if fig in r] for v in VARIANTS]
            if not all(cells):
                continue
            med = [statistics.median(c) for c in cells]
            text = [f"{m:.4g} ({', '.join(f'{x:.4g}' for x in c)})" for m, c in zip(med, cells, strict=True)]
            ratio = f"{med[1] / med[0]:.2f}" if med[0] else "-"
            lines.append(f"| {fig} | {text[0]} | {text[1]} | {ratio} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
