"""Does a server send its tokens one an event, or does it at times hold an answer and send it at once?

    python benchmarks/diagnostics/stream_events.py [--systems vllm tetriinfer-disaggregated] [--requests 24]
        [--idle 5]

Starts each system as ``slo_goodput.py`` does (plain vLLM on one engine thread; ours by preset and mode), sends
``slo_goodput.WARMUP`` requests at once, waits ``--idle`` seconds, then sends ``--requests`` ShareGPT requests
one at a time, spread over the prompt lengths as the goodput calibration picks them. Per request: its TTFT,
its stream events against its tokens, and whether it streamed (``slo_goodput.Outcome.streamed``: an event per
token, give or take a tenth). A stream whose tokens come in a few events was held up between engine and client,
so its TTFT is that delay and its token gaps near zero; this is why the goodput calibration keeps the fastest
of three tries that streamed. Writes ``stream_events.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
import slo_goodput as sg
from bench_results import WORK, measure_or_reload


def one_system(
    name: str, args: argparse.Namespace, model: str, env: dict[str, str], pairs: Any, profile: tuple[str, bool]
) -> dict[str, Any]:
    from vllm_bench_serve import serving

    cmd, senv = sg.server(name, model, env, *profile)
    rows = []
    with serving(cmd, senv, WORK / f"stream_events_{name}.log", sg.PORT):
        sg.send(sg.warmup_arrivals(pairs), None, 600)
        time.sleep(args.idle)
        for i, (ids, out) in enumerate(sg.spread(pairs, args.requests)):
            (o,) = sg.send([sg.Arrival(0.0, (3100 + i % 900, *ids), out)], None, 600)
            row = {"prompt": len(ids), "tokens": o.tokens, "events": o.chunks, "streamed": o.streamed}
            rows.append({**row, "ttft_ms": 1e3 * (o.ttft_s or 0.0)})
    return {"rows": rows}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from paper_policies import cost_profile, sharegpt_pairs
    from vllm_bench_serve import prepare

    model, _, env = prepare()
    pairs = sharegpt_pairs(300, 0, model, 512, 128)
    ours = any(name != "vllm" for name in args.systems)
    profile = (
        cost_profile(argparse.Namespace(cost_profile=args.cost_profile, profile_repeats=1)) if ours else ("", False)
    )
    systems = {name: one_system(name, args, model, env, pairs, profile) for name in args.systems}
    return {"idle_s": args.idle, "systems": systems}


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "-"


def report(d: dict[str, Any]) -> str:
    lines = [
        "# Stream events per token, one request at a time",
        "",
        f"Command: `{d['command'].strip()}`  ",
        f"After a warm-up of {sg.WARMUP} requests at once and {d['idle_s']:g} s idle; requests spread over the prompt "
        "lengths, one at a time.",
        "",
        "| system | requests | streamed | median TTFT ms, streamed | median TTFT ms, not streamed |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, s in d["systems"].items():
        rows = s["rows"]
        yes = [r["ttft_ms"] for r in rows if r["streamed"]]
        no = [r["ttft_ms"] for r in rows if not r["streamed"]]
        lines.append(f"| {name} | {len(rows)} | {len(yes)} | {_median(yes)} | {_median(no)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", choices=sg.SYSTEMS, default=["vllm", "tetriinfer-disaggregated"])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds idle between the warm-up and the requests")
    ap.add_argument("--cost-profile", default=None, help="our systems' profile (default: tetriserve profile now)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("stream_events", args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
