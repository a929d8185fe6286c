"""What the served length predictor costs end to end: tetriserve with `--predictor baseline` vs `trained`.

Same client, prompts, seed and Poisson rate as ``vllm_bench_serve.py``, one run after the other:

    python benchmarks/diagnostics/predictor_cost_serve.py --num-prompts 100 --request-rate 2

Writes ``predictor_cost_serve.md`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import METRICS, RESULTS
from vllm_bench_serve import prepare, serve_and_bench, tetriserve_cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--request-rate", type=float, default=2.0)
    args = ap.parse_args()
    model, dataset, env = prepare()
    results: dict[str, dict[str, float]] = {}
    for predictor in ("baseline", "trained"):
        cmd = tetriserve_cmd("--predictor", predictor)
        results[predictor] = serve_and_bench(f"predictor_{predictor}", cmd, 8100, env, args, model, dataset, "rate")
    b, t = results["baseline"], results["trained"]
    lines = [
        "# tetriserve end to end: baseline vs trained length predictor",
        "",
        f"Command: `python benchmarks/diagnostics/predictor_cost_serve.py --num-prompts {args.num_prompts} "
        f"--request-rate {args.request_rate}`  ",
        f"{os.cpu_count()} CPU cores; `tetriserve serve --predictor X`, otherwise defaults; vLLM's benchmark client "
        "(ShareGPT, Poisson, seed 0).",
        "",
        "| metric | baseline predictor | trained predictor | trained / baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    for k in METRICS:
        if k in b and k in t:
            lines.append(
                f"| {k} | {b[k]:.2f} | {t[k]:.2f} | {t[k] / b[k]:.2f} |" if b[k] else f"| {k} | 0 | {t[k]:.2f} | - |"
            )
    (RESULTS / "predictor_cost_serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
