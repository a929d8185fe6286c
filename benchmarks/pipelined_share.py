"""How often the pipelined handoff applies under load (issue #16; ``prefill_worker/pipeline.py``).

    python benchmarks/pipelined_share.py --num-prompts 200 --request-rate 2 --seed 0

The pipelined handoff starts only when a request's length prediction is ready
before its prefill ends (the dispatcher needs it to choose the decode worker).
One request at a time that held for most requests (``transfer_breakdown.md``);
under load the predictions queue. For each scenario of ``vllm_bench_serve.py``
(``rate``: Poisson arrivals at ``--request-rate``; ``saturation``: every prompt
at once), a fresh `tetriserve serve` with its defaults (1 prefill + 1 decode,
the trained predictor, the pipeline on), the same 64-prompt warm-up, then vLLM's
benchmark client on ShareGPT; the prefill worker's handoff counts, pipelined or
whole, are read before and after the measured run.

Writes ``benchmarks/results/pipelined_share.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transfer_breakdown import PORT, handoffs
from vllm_bench_report import WORK, measure_or_reload
from vllm_bench_serve import prepare, run_bench, stop, tetriserve_cmd, wait_ready

from tetriserve.common.prefill_config import PrefillConfig

SCENARIOS = ("rate", "saturation")
CHUNK = PrefillConfig().chunk_size  # tetriserve's default prefill chunk


def run_scenario(scenario: str, args: argparse.Namespace, model: str, dataset: Path, env: dict[str, str]) -> Any:
    with open(WORK / f"server_pipelined_share_{scenario}.log", "w") as log:
        proc = subprocess.Popen(tetriserve_cmd(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            wait_ready(f"http://127.0.0.1:{PORT}", proc)
            run_bench("pipelined_share", "warmup", PORT, args, model, dataset)
            before = handoffs()
            client = run_bench("pipelined_share", scenario, PORT, args, model, dataset)
            after = handoffs()
        finally:
            stop(proc)
    counted = {mode: after.get(mode, 0) - before.get(mode, 0) for mode in ("pipelined", "whole")}
    print(f"[{scenario}] {counted}", flush=True)
    detailed = json.loads((WORK / f"bench_pipelined_share_{scenario}.json").read_text())
    return {"client": client, "handoffs": counted, "prompt_tokens": list(detailed.get("input_lens", []))}


def report(data: dict[str, Any]) -> str:
    lines = [
        "# How often the pipelined handoff applies under load",
        "",
        f"Command: `{data['command']}`  ",
        "Each scenario on a fresh `tetriserve serve` (defaults: 1 prefill + 1 decode, trained length predictor, "
        "pipelined handoff on, tiny random-weight Llama, this machine's 2 cores), warmed with 64 prompts at once; "
        "then vLLM's benchmark client on ShareGPT. Handoffs of the measured run only: pipelined where the "
        "prediction was ready before the prefill ended (the decode worker chosen then, the KV moving during the "
        "prefill), whole otherwise.",
        "",
        f"A prompt longer than one prefill chunk ({CHUNK} tokens, the default `prefill.chunk_size`) is the only "
        "kind whose KV can move in more than one part.",
        "",
        f"| scenario | handoffs | pipelined | share | prompts over {CHUNK} tokens | median prompt tokens | "
        "client median TTFT ms | client median TPOT ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, run in data["scenarios"].items():
        done, client = run["handoffs"], run["client"]
        total = done["pipelined"] + done["whole"]
        share = f"{done['pipelined'] / total:.2f}" if total else "-"
        prompts = run["prompt_tokens"]
        longer = sum(1 for n in prompts if n > CHUNK)
        lines.append(
            f"| {scenario} | {total} | {done['pipelined']} | {share} | {longer} of {len(prompts)} | "
            f"{statistics.median(prompts):.0f} | {client['median_ttft_ms']:.2f} | {client['median_tpot_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    args.single_prompts = 0  # not a scenario here; vllm_bench_serve's scenario arguments read it

    def measure() -> dict[str, Any]:
        model, dataset, env = prepare()
        return {"scenarios": {s: run_scenario(s, args, model, dataset, env) for s in args.scenarios}}

    return measure_or_reload("pipelined_share", args.report_only, measure, report)


if __name__ == "__main__":
    raise SystemExit(main())
