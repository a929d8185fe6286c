"""CPU seconds of every process of the service over one scenario of vLLM's benchmark client.

    python benchmarks/diagnostics/process_cpu.py --scenario saturation --num-prompts 200 --seed 0 --out cpu_saturation

Runs one fresh ``tetriserve serve`` (extra ``--flags``) on the benchmark ports, warmed up as in
``vllm_bench_serve.py``, then the scenario (``rate``, ``single`` or ``saturation``, ``--ignore-eos``), and reads
every process's CPU time (``/proc/<pid>/stat``) of the server's session before and after it. Reports each
process's CPU seconds over the client's run (Ray names its actors' processes, ``ray::GlobalScheduler``) and the
client's figures; the header names the code (commit, and whether the tree had uncommitted changes). Compare two
commits by running it on each. Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import CLIENT, PORT, client_args
from vllm_bench_report import RESULTS, code_state, report_head
from vllm_bench_serve import cpu_by_process, prepare, run_bench, session_cpu, warmed_server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("rate", "single", "saturation"), default="saturation")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--single-prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flags", default="", help="extra `tetriserve serve` flags")
    ap.add_argument("--out", default="process_cpu")
    args = ap.parse_args()
    model, dataset, env = prepare()
    bench = client_args(args)
    with warmed_server("process_cpu", args.flags, bench, model, dataset, env) as proc:
        before, started = session_cpu(proc.pid), time.monotonic()
        client = run_bench("process_cpu", args.scenario, PORT, bench, model, dataset)
        seconds = time.monotonic() - started
        cores = cpu_by_process(before, session_cpu(proc.pid), seconds)
    result = {
        "command": sys.argv[1:],
        "code": code_state(),
        "seconds": round(seconds, 1),
        "client": {k: client.get(k) for k in CLIENT},
        "cpu_seconds": {name: round(share * seconds, 2) for name, share in cores.items()},
    }
    c = result["client"]
    lines = [
        *report_head(args.out, "CPU seconds by process over one scenario", "process_cpu.py", result),
        f"Scenario `{args.scenario}` of vLLM's benchmark client (ShareGPT, seed {args.seed}, `--ignore-eos`) on a "
        f"fresh `tetriserve serve` after the 64-prompt warm-up: {c['completed']:.0f} completed, "
        f"{c['output_throughput']:.0f} output tokens/s, median TTFT {c['median_ttft_ms']:.0f} ms, median TPOT "
        f"{c['median_tpot_ms']:.2f} ms. CPU seconds of each process of the server from the client's start to its "
        f"end ({result['seconds']} s, the client's own start-up included); processes under 0.5% of a core left out.",
        "",
        "| process | CPU s |",
        "| --- | ---: |",
        *(f"| {name} | {cpu:.2f} |" for name, cpu in result["cpu_seconds"].items()),
        f"| **all** | **{sum(result['cpu_seconds'].values()):.2f}** |",
    ]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
