"""The cost profile for people: a PNG and a markdown summary beside the JSON (AccelGen §4.2 Fig. "pivot").

<stem>.png   throughput (tokens/s) and latency (ms) against forward size, pivot S_pf marked,
             eq. 3's single-request prediction over the latency, held-out predicted vs measured
<stem>.md    the command, the engine, the pivot, the sweep table, the coefficients, the fit errors
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tetriserve.engine.profile_fit import Calibration

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class ReportContext:
    """What the numbers were measured with."""

    command: str
    engine: str  # one line: dtype, threads, compiled or eager, lengths
    repeats: int
    runtime_s: float
    samples: str  # one line: scenario and iteration counts


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def write_plot(cal: Calibration, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prof = cal.profile
    sizes = [p.forward_tokens for p in prof.sweep]
    fig, (ax_t, ax_l, ax_f) = plt.subplots(1, 3, figsize=(15, 4.2))
    ax_t.plot(sizes, [p.tokens_per_s for p in prof.sweep], "o-", color="tab:blue")
    best = max(p.tokens_per_s for p in prof.sweep)
    ax_t.axhline(cal.saturation * best, color="grey", ls=":", lw=1, label=f"{cal.saturation:.0%} of best")
    ax_t.set_ylabel("throughput (tokens/s)")
    ax_l.plot(sizes, [1e3 * p.seconds for p in prof.sweep], "o-", color="tab:orange", label="measured")
    ax_l.plot(sizes, [1e3 * prof.prefill.predict([(0, s)]) for s in sizes], "--", color="black", lw=1, label="eq. 3")
    ax_l.set_ylabel("iteration latency (ms)")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("forward size S (tokens, one request)")
        ax.axvline(prof.pivot_tokens, color="tab:red", ls="--", lw=1, label=f"pivot S_pf = {prof.pivot_tokens}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _parity(ax_f, cal)
    fig.suptitle(f"{prof.model} on {prof.hardware}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _parity(ax: Axes, cal: Calibration) -> None:
    lo, hi = math.inf, 0.0
    for name, rep, color in (("prefill", cal.prefill, "tab:orange"), ("decode", cal.decode, "tab:green")):
        meas = [1e3 * t for t in rep.test_measured]
        pred = [1e3 * t for t in rep.test_predicted]
        if meas:
            ax.scatter(meas, pred, s=12, color=color, label=f"{name} (held out, {_pct(rep.test_error)})")
            lo, hi = min(lo, *meas, *pred), max(hi, *meas, *pred)
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(cal: Calibration, ctx: ReportContext, png_name: str) -> str:
    prof = cal.profile
    best = max(p.tokens_per_s for p in prof.sweep)
    sweep_rows = [
        [
            f"**{p.forward_tokens}**" if p.forward_tokens == prof.pivot_tokens else str(p.forward_tokens),
            f"{1e3 * p.seconds:.2f}",
            f"{1e3 * prof.prefill.predict([(0, p.forward_tokens)]):.2f}",
            f"{p.tokens_per_s:,.0f}",
            f"{100 * p.tokens_per_s / best:.0f}%",
        ]
        for p in prof.sweep
    ]
    pc, dc = prof.prefill, prof.decode
    coef_rows = [
        ["eq. 3 prefill", "a₀ (Σ l_has·l_in)", f"{pc.a0:.4g}", "s / token²"],
        ["", "b₀ (Σ l_in²)", f"{pc.b0:.4g}", "s / token²"],
        ["", "c₀ (Σ l_in)", f"{pc.c0:.4g}", "s / token"],
        ["", "d₀", f"{pc.d0:.4g}", "s"],
        ["eq. 4 decode", "a₁ (B)", f"{dc.a1:.4g}", "s / request"],
        ["", "b₁ (Σ l_has)", f"{dc.b1:.4g}", "s / context token"],
        ["", "c₁", f"{dc.c1:.4g}", "s"],
    ]
    err_rows = [
        [name, str(r.n_train), _pct(r.train_error), str(r.n_test), _pct(r.test_error), _pct(r.noise)]
        for name, r in (("prefill (eq. 3)", cal.prefill), ("decode (eq. 4)", cal.decode))
    ]
    lines = [
        f"# Cost profile: {prof.model} on {prof.hardware}",
        "",
        f"Command: `{ctx.command}`  ",
        f"Engine: {ctx.engine}  ",
        f"Each iteration timed around `engine.step()`, median of {ctx.repeats} round(s); {ctx.samples}; "
        f"profiling took {ctx.runtime_s:.0f} s.",
        "",
        f"**Pivot** (smallest S reaching {cal.saturation:.0%} of the best throughput, {best:,.0f} tokens/s): "
        f"S_pf = **{prof.pivot_tokens} tokens**, T̄_pf = **{1e3 * prof.pivot_seconds:.2f} ms**.",
        "",
        "**Tile** (SOLA §4.4.3's k_i quantum: the largest power-of-two S whose 1.5·S takes as long as 2·S): "
        + (f"**{prof.tile_tokens} tokens**." if prof.tile_tokens is not None else "none found in the sweep."),
        "",
        f"![throughput, latency and fit]({png_name})",
        "",
        "## Forward-size sweep (one request, one iteration of S prompt tokens)",
        "",
        *_table(["S (tokens)", "measured (ms)", "eq. 3 (ms)", "tokens/s", "of best"], sweep_rows, "rrrrr"),
        "",
        "## Fitted cost models (SOLA §5.2)",
        "",
        *_table(["model", "coefficient", "value", "unit"], coef_rows, "llrl"),
        "",
        "## Fit error: mean |predicted − measured| / measured (SOLA reports 4.98–5.92%)",
        "",
        *_table(
            ["model", "train iterations", "train error", "held-out iterations", "held-out error", "measurement noise"],
            err_rows,
            "lrrrrr",
        ),
        "",
        "Held out: every fourth scenario of each kind from the second on, never a kind's largest "
        "(`engine.profile_plan.held_out`); the coefficients above are fitted on the rest. Measurement noise: "
        "mean |t − median| / median of the same iteration over the repeats (n/a with one repeat), the floor "
        "no model of the composition can beat.",
        "",
        *scls_section(cal),
    ]
    return "\n".join(lines)


def scls_section(cal: Calibration) -> list[str]:
    """SCLS's estimators (SCLS §4.2 eq. 3 / eq. 4, §4.3 Δ and M_ava), where the profile has them."""
    scls, errors = cal.profile.scls, cal.scls_errors
    if scls is None or errors is None:
        return []
    st = scls.serving
    p_values = ", ".join(f"{v:.4g}" for v in (st.p1, st.p2, st.p3, st.p4))
    d_values = ", ".join(f"{v:.4g}" for v in (st.d1, st.d2, st.d3, st.d4))
    rows = [
        ["eq. 3 T_prefill(N, L_i)", "p1 (N·L_i), p2 (N), p3 (L_i), p4", p_values, _pct(errors[0])],
        ["eq. 4 τ_decode(l, N)", "d1 (N·l), d2 (N), d3 (l), d4", d_values, _pct(errors[1])],
    ]
    return [
        "## SCLS estimators (SCLS §4.2, §4.3)",
        "",
        *_table(["model", "coefficients", "values (s)", "error, all samples"], rows, "lllr"),
        "",
        f"Δ = {scls.kv_bytes_per_token:,.0f} bytes of KV per token; M_ava = {scls.kv_pool_bytes / 2**30:.2f} GiB "
        "(the KV pool vLLM sized). Eq. 3 is fitted on the iterations that start prompts together (L_i the "
        "longest), eq. 4 on the pure decode ones (l the longest context), by least squares weighted by 1/t "
        "with non-negative coefficients.",
        "",
    ]


def write_report(cal: Calibration, ctx: ReportContext, report_dir: Path, stem: str) -> tuple[Path, Path]:
    png = write_plot(cal, report_dir / f"{stem}.png")
    md = report_dir / f"{stem}.md"
    md.write_text(markdown(cal, ctx, png.name))
    return png, md
