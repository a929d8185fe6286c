"""Where a policy loses SLO attainment against the default, by prompt length (reads ``paper_policies.json``).

    python benchmarks/diagnostics/attainment_by_prompt.py [--results benchmarks/results/paper_policies.json]
        [--configs sola scls] [--edges 64 128 256]

``paper_policies.py`` keeps every request's outcome (TTFT, mean TBT, its SLO class) but not its prompt. This
rebuilds the benchmark's workload from the arguments the result records (the same ShareGPT draw, tokenizer and
seed), joins each outcome to its prompt's length, and reports per mode, configuration and prompt-length
bucket — over every round's requests — the median TTFT, the median mean-TBT and the share meeting both SLOs,
beside the default's. It answers whether a policy's lower attainment comes from how it orders requests (the
loss would gather at some prompt lengths) or from slower steps (a gap at every length). Writes
``attainment_by_prompt.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import ROOT, measure_or_reload
from paper_policies import sharegpt_pairs

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "paper_policies.json"


def bucket_of(length: int, edges: list[int]) -> str:
    lo = 0
    for edge in edges:
        if length <= edge:
            return f"{lo + 1}–{edge}"
        lo = edge
    return f">{lo}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    data = json.loads(Path(args.results).read_text())
    a = data["args"]  # the workload's flags as the benchmark recorded them
    model = str(build_tiny_model(default_tiny_model_dir()))
    pairs = sharegpt_pairs(a["num_prompts"], a["seed"], model, a["max_prompt"], a["max_tokens"])
    prompt_len = {f"pp-{i}": len(prompt) for i, (prompt, _) in enumerate(pairs)}
    out: dict[str, Any] = {}
    for mode, by_config in data["runs"].items():
        for config in ["default", *args.configs]:
            if config not in by_config:
                continue
            groups: dict[str, list[tuple[float, float, bool]]] = {}
            for run in by_config[config]:
                names = run["outcome_fields"]
                for row in run["outcomes"]:
                    o = dict(zip(names, row, strict=True))
                    if o["error"] is not None or o["ttft_s"] is None:
                        continue
                    met = o["ttft_s"] * 1e3 <= o["ttft_slo_ms"] and (o["tbt_s"] or 0.0) * 1e3 <= o["tbt_slo_ms"]
                    key = bucket_of(prompt_len[o["rid"]], args.edges)
                    groups.setdefault(key, []).append((o["ttft_s"] * 1e3, (o["tbt_s"] or 0.0) * 1e3, met))
            out.setdefault(mode, {})[config] = {
                key: {
                    "requests": len(rows),
                    "ttft_p50_ms": statistics.median(r[0] for r in rows),
                    "tbt_p50_ms": statistics.median(r[1] for r in rows),
                    "attain_both": sum(r[2] for r in rows) / len(rows),
                }
                for key, rows in sorted(groups.items(), key=lambda kv: _order(kv[0]))
            }
    return {"source": str(args.results), "source_command": data["command"], "by_prompt": out}


def _order(key: str) -> int:
    return int(key.lstrip(">").split("–")[0])


def report(d: dict[str, Any]) -> str:
    lines = [
        "# SLO attainment against the default, by prompt length",
        "",
        f"Command: `{d['command'].strip()}`  ",
        f"Source: `{d['source_command']}` (every round's requests). Per prompt-length bucket (tokens): requests, "
        "median TTFT, median of each request's mean TBT, share meeting both SLOs.",
    ]
    for mode, by_config in d["by_prompt"].items():
        base = by_config["default"]
        for config, buckets in by_config.items():
            if config == "default":
                continue
            lines += [
                "",
                f"## {mode}: {config} against default",
                "",
                "| prompt | requests | TTFT p50 ms | default | TBT p50 ms | default | both met | default |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for key, row in buckets.items():
                b = base.get(key)
                if b is None:
                    continue
                lines.append(
                    f"| {key} | {row['requests']} | {row['ttft_p50_ms']:.1f} | {b['ttft_p50_ms']:.1f} | "
                    f"{row['tbt_p50_ms']:.2f} | {b['tbt_p50_ms']:.2f} | {row['attain_both']:.0%} | "
                    f"{b['attain_both']:.0%} |"
                )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(DEFAULT_RESULTS), help="a paper_policies.py result (JSON)")
    ap.add_argument("--configs", nargs="+", default=["sola", "scls"], help="configurations set against default")
    ap.add_argument("--edges", type=int, nargs="+", default=[64, 128, 256], help="upper ends of prompt buckets")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("attainment_by_prompt", args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
