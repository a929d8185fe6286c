"""How often the pipelined handoff applies under load (``prefill_worker/pipeline.py``).

    python benchmarks/diagnostics/pipelined_share.py --num-prompts 200 --request-rate 2 --seed 0 --rounds 2

The pipelined handoff starts once the decode worker is chosen before the
prefill ends: when the request's length prediction is ready first (the
dispatcher needs it), or at once when there is one decode worker to choose from
and the prompt's KV leaves in several parts. One request at a time the
prediction came first for most requests (``transfer_breakdown.md``); under load
the predictions queue. For each scenario of ``vllm_bench_serve.py``
(``rate``: Poisson arrivals at ``--request-rate``; ``saturation``: every prompt
at once), a fresh `tetriserve serve` with its defaults (1 prefill + 1 decode,
the trained predictor, the pipeline on), the same 64-prompt warm-up, then vLLM's
benchmark client on ShareGPT; the prefill worker's handoff counts, pipelined or
whole, are read before and after the measured run. Each round runs every
variant (``--variant NAME=FLAGS``; by default the pipeline on, and off with
``--no-kv-pipeline``), in alternating order from round to round, so the
client's TTFT and TPOT with and without it come from the same stretch of time.

Writes ``pipelined_share.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import measure_or_reload
from transfer_breakdown import PORT, handoffs
from vllm_bench_report import WORK
from vllm_bench_serve import prepare, run_bench, stop, tetriserve_cmd, wait_ready

from tetriserve.common.prefill_config import PrefillConfig

SCENARIOS = ("rate", "saturation")
CHUNK = PrefillConfig().chunk_size  # tetriserve's default prefill chunk


def run_scenario(
    scenario: str, variant: tuple[str, str], args: argparse.Namespace, model: str, dataset: Path, env: dict[str, str]
) -> Any:
    """One run of ``scenario`` on a fresh server with ``variant``'s (name, flags); its log names both."""
    name, flags = variant
    with open(WORK / f"server_pipelined_share_{name}_{scenario}.log", "w") as log:
        proc = subprocess.Popen(tetriserve_cmd(*shlex.split(flags)), env=env, stdout=log, stderr=subprocess.STDOUT,
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
    print(f"[{scenario} {flags or 'defaults'}] {counted}", flush=True)
    detailed = json.loads((WORK / f"bench_pipelined_share_{scenario}.json").read_text())
    return {"client": client, "handoffs": counted, "prompt_tokens": list(detailed.get("input_lens", []))}


def runs_of(data: dict[str, Any]) -> list[tuple[int, str, str, Any]]:
    """(round, variant, scenario, run) for every run saved; a report of one round and no variants (the
    first version of this benchmark) reads as round 1 of the defaults."""
    rounds = data["rounds"] if "rounds" in data else [{"defaults": data["scenarios"]}]
    return [
        (i, variant, scenario, run)
        for i, by_variant in enumerate(rounds, 1)
        for variant, scenarios in by_variant.items()
        for scenario, run in scenarios.items()
    ]


def report(data: dict[str, Any]) -> str:
    lines = [
        "# How often the pipelined handoff applies under load",
        "",
        f"Command: `{data['command']}`  ",
        "Each scenario of each variant on a fresh `tetriserve serve` (defaults but for the variant's flags: 1 "
        "prefill + 1 decode, trained length predictor, pipelined handoff on, tiny random-weight Llama, this "
        "machine's 2 cores), warmed with 64 prompts at once; then vLLM's benchmark client on ShareGPT. Each round "
        "runs every variant, in alternating order from round to round. Handoffs of the measured run only: "
        "pipelined where the decode worker was chosen before the prefill ended (the prediction ready first, or one "
        "decode worker and a prompt of several chunks), the KV moving during the prefill; whole otherwise.",
        "",
        f"A prompt longer than one prefill chunk ({CHUNK} tokens, the default `prefill.chunk_size`) always moves "
        "in more than one part (a shorter one only when a step splits it), and is the kind whose decode worker is "
        "chosen without waiting for the prediction when there is one decode worker.",
        "",
        "Variants: "
        + ", ".join(
            f"`{name}` = `serve {flags}`" if flags else f"`{name}` = defaults"
            for name, flags in data.get("variants", {"defaults": ""}).items()
        )
        + ".",
        "",
        f"| round | variant | scenario | handoffs | pipelined | share | prompts over {CHUNK} tokens | "
        "median prompt tokens | client median TTFT ms | client median TPOT ms | output tok/s |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_variant: dict[tuple[str, str], list[dict[str, float]]] = {}
    for i, variant, scenario, run in runs_of(data):
        done, client = run["handoffs"], run["client"]
        by_variant.setdefault((scenario, variant), []).append(client)
        total = done["pipelined"] + done["whole"]
        share = f"{done['pipelined'] / total:.2f}" if total else "-"
        prompts = run["prompt_tokens"]
        longer = sum(1 for n in prompts if n > CHUNK)
        lines.append(
            f"| {i} | {variant} | {scenario} | {total} | {done['pipelined']} | {share} | {longer} of {len(prompts)} | "
            f"{statistics.median(prompts):.0f} | {client['median_ttft_ms']:.2f} | {client['median_tpot_ms']:.2f} | "
            f"{client.get('output_throughput', float('nan')):.0f} |"
        )
    lines += ["", "Medians over the rounds:", "", "| scenario | variant | rounds | TTFT ms | TPOT ms | output tok/s |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for (scenario, variant), clients in by_variant.items():
        med = {k: statistics.median(c.get(k, float("nan")) for c in clients)
               for k in ("median_ttft_ms", "median_tpot_ms", "output_throughput")}  # fmt: skip
        lines.append(
            f"| {scenario} | {variant} | {len(clients)} | {med['median_ttft_ms']:.2f} | {med['median_tpot_ms']:.2f} | "
            f"{med['output_throughput']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--rounds", type=int, default=1, help="each round runs every variant, order alternating")
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME=FLAGS",
        help="a `tetriserve serve` configuration to run (repeatable); default: pipelined= whole=--no-kv-pipeline",
    )
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.single_prompts = 0  # not a scenario here; vllm_bench_serve's scenario arguments read it
    variants: dict[str, str] = {}
    for spec in args.variant or ("pipelined=", "whole=--no-kv-pipeline"):
        name, sep, flags = spec.partition("=")
        if not sep or not name or name in variants:
            ap.error(f"--variant {spec!r}: give NAME=FLAGS, each NAME once")
        variants[name] = flags

    def measure() -> dict[str, Any]:
        model, dataset, env = prepare()
        rounds = []
        for i in range(args.rounds):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            ran = {v: {s: run_scenario(s, (v, variants[v]), args, model, dataset, env) for s in args.scenarios}
                   for v in order}  # fmt: skip
            rounds.append({v: ran[v] for v in variants})
        return {"variants": variants, "rounds": rounds}

    return measure_or_reload("pipelined_share", args.report_only, measure, report)


if __name__ == "__main__":
    raise SystemExit(main())
