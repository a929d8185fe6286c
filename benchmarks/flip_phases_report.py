"""Markdown tables and the timeline plot of ``flip_phases.py``'s results."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from bench_results import provenance

METRICS = (
    ("median_ttft_ms", "median TTFT ms"),
    ("p90_ttft_ms", "p90 TTFT ms"),
    ("median_tpot_ms", "median TPOT ms"),
    ("median_jct_ms", "median JCT ms"),
    ("slo_attainment", "SLO attainment"),
    ("goodput_rps", "goodput req/s"),
    ("failed", "failed"),
)
COLORS = {"prefill": "tab:orange", "decode": "tab:blue", "draining": "tab:gray", "flipping": "tab:red"}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


def write_report(report: dict[str, Any], md: Path, png: Path) -> None:
    a = report["args"]
    names = list(report["configs"])
    lines = [
        "# Flip policies on a phase-changing workload",
        "",
        *provenance(report),
        f"Workload: {report['workload']['requests']} requests in phases {', '.join(report['workload']['phases'])} "
        f"({a['seconds_per_phase']:g} s each at {a['prefill_rate']:g} / {a['decode_rate']:g} / {a['mixed_rate']:g} "
        f"req/s, Poisson; ShareGPT prompts, answer lengths capped at {a['max_output']} tokens, forced with "
        f"`ignore_eos`); classes {report['workload']['classes']}; SLO per request: TTFT ≤ {a['ttft_slo_ms']:g} ms "
        f"and TPOT ≤ {a['tpot_slo_ms']:g} ms (goodput: requests meeting both per second).  ",
        f"Each configuration: a fresh `tetriserve serve` with {a['num_prefill']} prefill + {a['num_decode']} "
        "decode workers (all engines on this machine's 2 cores), 8 warm-up requests, then the workload over gRPC. "
        "A flip swaps the worker's role on the engine it has (no reload); `tetriinfer` flips after 10 s "
        "idle (the paper: 60 s; the phases here are shorter), `slo` with its defaults (cooldown 30 s, 20 samples).",
        "",
    ]
    for phase in ["all", *report["workload"]["phases"]]:
        lines += [f"## {phase}", "", "| metric | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
        for key, label in METRICS:
            row = [_fmt(report["configs"][n]["summary"][phase][key]) for n in names]
            lines.append(f"| {label} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Flips", "",
              "Swap: the role change on the engine, timed by the worker (TetriInfer's 5–7 ms). Switch: end of the "
              "drain until the control plane saw the worker serve in its new role (its 0.25 s ticks and the "
              "worker's first report included). Order → served: from the flip decision, drain included, to the "
              "first request served in the new role.", "",
              "| config | done at s | worker | to | swap ms | switch ms | order → first request served ms |",
              "| --- | ---: | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
    for n in names:
        for f in report["configs"][n]["flips"]:
            lines.append(
                f"| {n} | {f['t_s']} | {f['worker']} | {f['to']} | {_fmt(f.get('engine_swap_ms'))} | "
                f"{_fmt(f.get('switch_ms'))} | {_fmt(f.get('decision_to_served_ms'))} |"
            )
        if not report["configs"][n]["flips"]:
            lines.append(f"| {n} | - | - | - | - | - | - |")
    lines += ["", f"![roles and queues over time]({png.name})", ""]
    md.write_text("\n".join(lines))
    _plot(report, png)


def _plot(report: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["configs"])
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        timeline = report["runs"][name]["timeline"]
        workers = sorted({w for snap in timeline for w in snap["workers"]})
        for row, wid in enumerate(workers):
            for snap, nxt in itertools.pairwise(timeline):
                w = snap["workers"].get(wid)
                if w is None:
                    continue
                state = w["lifecycle"] if w["lifecycle"] in ("draining", "flipping") else w["role"]
                ax.barh(row, nxt["t"] - snap["t"], left=snap["t"], height=0.6, color=COLORS.get(state, "white"))
        ax.set_yticks(range(len(workers)), workers)
        twin = ax.twinx()
        t = [s["t"] for s in timeline]
        for role, style in (("prefill", "-"), ("decode", "--")):
            q = [sum(w["queued"] + w["running"] for w in s["workers"].values() if w["role"] == role) for s in timeline]
            twin.plot(t, q, style, color="black", linewidth=0.8, label=f"{role} queued + running")
        twin.set_ylabel("requests")
        twin.legend(loc="upper right", fontsize=7)
        ax.set_title(f"{name}: role of each worker (orange prefill, blue decode, gray draining, red flipping)")
        ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
