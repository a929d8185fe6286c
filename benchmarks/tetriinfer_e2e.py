"""TetriInfer §5.1 live: its five workloads on the ``tetriinfer`` preset against this service colocated and
against plain vLLM, on the same cores, with vLLM's own benchmark client.

TetriInfer §5.1 (Figure 16) runs five workloads of 128 ShareGPT requests against vLLM and reports average TTFT,
average JCT and perf/$: LPLD, LPHD, HPLD, HPHD and Mixed, a prompt over 512 tokens being heavy prefill and an
answer over 128 tokens heavy decode (``common/workload.classify``), Mixed drawn from the whole pool. Each request
asks for its ShareGPT answer's length (``--ignore-eos``: the client sends the answer's token count as max_tokens).

Systems, each a fresh server per seed whose processes run in a session of their own:

    tetriinfer         tetriserve serve --preset tetriinfer: 1 prefill + 1 decode engine of one thread each
    tetriinfer-oracle  the same with the true output lengths (--predictor oracle): the policies apart from
                       the prediction, as the paper's Figure 18 separates them
    tetriinfer-shared  the preset with the decode engine sharing every core (--no-reserve-decode-cores: at
                       niceness 5, below the prefill engine's -10) instead of a core of its own
    colocated          tetriserve serve --mode colocated: two one-thread engines that each run both phases (the
                       same cores as tetriinfer: the effect of disaggregation itself)
    vllm               plain vLLM, one engine thread
    vllm-nochunk       plain vLLM, one thread, chunked prefill off (the paper's vLLM had none)
    vllm-2t            plain vLLM, two threads (for reference)

On each server, after a warm-up of ``WARMUP`` requests (not measured), two scenarios per workload, in turn:

    burst    the workload at once: its makespan gives the capacity, and the CPU-seconds of the server's process
             tree over it the resource usage; perf/$ is output tokens per server CPU-second
    poisson  Poisson arrivals at ``--load`` (0.7) of the colocated server's burst capacity, in requests per
             second, for the same seed and workload: average TTFT and JCT

A seed draws every request it sends (warm-up, and each workload's burst and Poisson sets) without repeating a
prompt, so no system gains from its prefix cache. The colocated server runs first for each seed, since the rates
are taken from it; the others follow in an order rotated from one seed to the next. A ratio (tetriinfer / a vLLM
baseline) is taken per seed; the report gives its mean over seeds with a 95% confidence interval (Student's t
over the seeds), and claims a direction only where the interval of the relative change excludes zero. The load
generator's CPU-seconds are recorded apart (``client_cpu_s``), never in a server's.

    python benchmarks/tetriinfer_e2e.py --seeds 0 1 2

Around each burst it also reads the engines' busy seconds (this service: time in engine steps on ``/metrics``;
plain vLLM: its engine processes' CPU-seconds) and the server's CPU-seconds by process.

Writes ``benchmarks/results/tetriinfer_e2e.{md,json,png}`` (``--out``); ``--report-only`` rewrites the report and
the plot from the saved JSON; ``--resume --systems ...`` runs more systems on the saved seeds (the draws are the
same per seed; the Poisson rates come from the saved colocated bursts) and adds them:

    python benchmarks/tetriinfer_e2e.py --seeds 0 1 2 --num-prompts 64 --resume --systems vllm-2t
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import RESULTS, WORK, provenance, run_facts, write_result  # noqa: E402

WORKLOADS = ("LPLD", "LPHD", "HPLD", "HPHD", "Mixed")
SYSTEMS = ("tetriinfer", "tetriinfer-oracle", "tetriinfer-shared", "colocated", "vllm", "vllm-nochunk", "vllm-2t")
BASELINES = ("vllm", "vllm-nochunk", "vllm-2t")
WARMUP = 8
# plain vLLM's engine processes, as their process titles name them: the engine core (scheduler, and the model
# itself with one process) and its model worker (with a multiprocess executor)
VLLM_ENGINE = ("VLLM::EngineCore", "VLLM::Worker")
PORT = 8100
MAX_MODEL_LEN = 2048
# vLLM's benchmark client keeps a ShareGPT pair only when the prompt has 4-1024 tokens, the answer at least 4 and
# both at most 2048 (vllm.benchmarks.datasets.is_valid_sequence): every request chosen here passes, so the client
# sends exactly the chosen ones
CLIENT_MIN, CLIENT_MAX_PROMPT, CLIENT_MAX_TOTAL = 4, 1024, 2048
# The Poisson run sends the burst's requests again, each prompt led by TAG: the first KV block then differs, so
# no system finds the burst's prompts in its prefix cache. A pair is kept only with room for TAG_TOKENS more.
TAG, TAG_TOKENS = "(again) ", 8

# TetriInfer §5.1 against vLLM: the relative change of average TTFT and JCT, and perf/$ as a factor (None: the
# paper gives no figure; HPHD's TTFT gain is only called "more pronounced" than HPLD's)
PAPER: dict[str, tuple[float | None, float | None, float | None]] = {
    "LPLD": (-0.44, -0.40, 1.4),
    "LPHD": (-0.97, -0.47, 2.4),
    "HPLD": (-0.09, -0.23, 0.86),
    "HPHD": (None, -0.19, 1.1),
    "Mixed": (-0.85, -0.50, 1.9),
}


# -- the workloads (pure) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """A ShareGPT prompt and its answer, with their lengths as vLLM's client counts them (its tokenizer's ids,
    special tokens included)."""

    prompt: str
    answer: str
    prompt_tokens: int
    answer_tokens: int

    @property
    def workload(self) -> str:
        heavy_prefill, heavy_decode = self.prompt_tokens > 512, self.answer_tokens > 128
        return ("HP" if heavy_prefill else "LP") + ("HD" if heavy_decode else "LD")

    @property
    def client_keeps(self) -> bool:
        p, a = self.prompt_tokens, self.answer_tokens
        room = TAG_TOKENS
        return CLIENT_MIN <= p <= CLIENT_MAX_PROMPT - room and a >= CLIENT_MIN and p + a <= CLIENT_MAX_TOTAL - room

    def tagged(self) -> Pair:
        """The pair as the Poisson run sends it (``TAG`` first; the lengths are the untagged ones)."""
        return Pair(TAG + self.prompt, self.answer, self.prompt_tokens, self.answer_tokens)


def choose(
    pairs: Sequence[Pair],
    workload: str,
    n: int,
    seed: int,
    exclude: frozenset[str] = frozenset(),
    short_ok: bool = False,
) -> list[Pair]:
    """``n`` pairs of ``workload`` (Mixed: of any) drawn without replacement by ``seed`` among those vLLM's
    client keeps, one per prompt text and none whose prompt is in ``exclude``. When the pool has fewer: all it
    has with ``short_ok`` (at least one), else ValueError."""
    kept = list(
        {
            p.prompt: p
            for p in pairs
            if p.client_keeps and p.prompt not in exclude and (workload == "Mixed" or p.workload == workload)
        }.values()
    )
    if len(kept) < n and not (short_ok and kept):
        raise ValueError(f"{workload}: {len(kept)} usable ShareGPT pairs, {n} wanted")
    return random.Random(f"{workload}-{seed}").sample(kept, min(n, len(kept)))


@dataclass(frozen=True)
class Draw:
    """One seed's requests: per workload a burst set and the Poisson set (the same pairs, tagged), and the warm-up
    requests; no prompt is sent twice (a prompt seen before would hit the prefix cache of every system, ours and
    vLLM's, and flatter its TTFT)."""

    warmup: list[Pair]
    burst: dict[str, list[Pair]]

    @property
    def poisson(self) -> dict[str, list[Pair]]:
        return {w: [p.tagged() for p in chosen] for w, chosen in self.burst.items()}

    def every(self) -> list[Pair]:
        poisson = self.poisson
        return [*self.warmup, *(p for w in self.burst for p in (*self.burst[w], *poisson[w]))]


def draw(pairs: Sequence[Pair], workloads: Sequence[str], n: int, seed: int) -> Draw:
    """``n`` requests of each workload (of a class the pool holds fewer of: all it has) and ``WARMUP`` warm-up
    requests, all prompts distinct: the four classes first, then Mixed and the warm-up from what is left."""
    used: set[str] = set()
    burst: dict[str, list[Pair]] = {}
    for w in sorted(workloads, key=lambda w: w == "Mixed"):
        burst[w] = choose(pairs, w, n, seed, frozenset(used), short_ok=True)
        used.update(p.prompt for p in burst[w])
    warmup = choose(pairs, "Mixed", WARMUP, seed, frozenset(used))
    return Draw(warmup, {w: burst[w] for w in workloads})


def sharegpt_file(chosen: Sequence[Pair]) -> list[dict[str, Any]]:
    """The chosen pairs in the format vLLM's client reads (``--dataset-name sharegpt``)."""
    return [
        {"id": f"t{i}", "conversations": [{"from": "human", "value": p.prompt}, {"from": "gpt", "value": p.answer}]}
        for i, p in enumerate(chosen)
    ]


def oracle_lines(chosen: Sequence[Pair]) -> list[str]:
    """The oracle predictor's workload (``prefill.predictor_workload``): each prompt's text and its true length."""
    return [json.dumps({"prompt": p.prompt, "response_len": p.answer_tokens}) for p in chosen]


# -- one run's figures and the comparison (pure) ---------------------------------------------------------------


def figures(result: Mapping[str, Any]) -> dict[str, float]:
    """What the report reads of the client's saved JSON (``--save-detailed``): means over the completed requests
    of TTFT and of JCT (the client's end-to-end latency), the makespan and the output tokens."""
    ttfts = [t for t in result.get("ttfts", []) if t]
    lats = [t for t in result.get("latencies", []) if t]
    return {
        "completed": float(result["completed"]),
        "failed": float(result.get("failed", 0)),
        "duration_s": float(result["duration"]),
        "output_tokens": float(result["total_output_tokens"]),
        "ttft_mean_ms": 1e3 * statistics.mean(ttfts) if ttfts else math.nan,
        "jct_mean_ms": 1e3 * statistics.mean(lats) if lats else math.nan,
    }


def capacity(burst: Mapping[str, float]) -> float:
    """Requests per second a burst was served at: completed over its makespan."""
    return burst["completed"] / burst["duration_s"] if burst["duration_s"] > 0 else math.nan


def perf_per_cpu(burst: Mapping[str, float]) -> float:
    """perf/$ here: output tokens per CPU-second of the server's processes over the burst."""
    return burst["output_tokens"] / burst["server_cpu_s"] if burst.get("server_cpu_s") else math.nan


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(xs: Sequence[float]) -> tuple[float, float, float]:
    """Mean of ``xs`` and its 95% confidence interval by Student's t (nan bounds with one value)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan, math.nan
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def direction(lo: float, hi: float, lower_is_better: bool) -> str:
    """What an interval of relative change claims: better, worse, or nothing (it spans zero or is unknown)."""
    if math.isnan(lo) or math.isnan(hi) or lo <= 0 <= hi:
        return "no claim"
    return "better" if (hi < 0) == lower_is_better else "worse"


# what a row compares: (key, label, lower is better, the per-seed value from a system's two runs)
METRICS: tuple[tuple[str, str, bool, Callable[[Mapping[str, Any]], float]], ...] = (
    ("ttft", "TTFT", True, lambda run: run["poisson"]["ttft_mean_ms"]),
    ("jct", "JCT", True, lambda run: run["poisson"]["jct_mean_ms"]),
    ("perf", "perf/$", False, lambda run: perf_per_cpu(run["burst"])),
)


def compare(
    runs: Mapping[str, Mapping[str, Mapping[str, Any]]], workload: str, ours: str, base: str
) -> dict[str, dict[str, float | str]]:
    """Per metric, ``ours`` against ``base`` on ``workload`` over the seeds (``runs[seed][workload][system]``):
    the relative change's mean and 95% interval, and the direction it claims."""
    out: dict[str, dict[str, float | str]] = {}
    for key, _, lower, value in METRICS:
        changes = []
        for by_workload in runs.values():
            systems = by_workload.get(workload, {})
            if ours in systems and base in systems:
                a, b = value(systems[ours]), value(systems[base])
                changes.append(a / b - 1 if b and not math.isnan(a) and not math.isnan(b) else math.nan)
        m, lo, hi = interval(changes)
        out[key] = {"change": m, "lo": lo, "hi": hi, "seeds": float(len(changes)), "claim": direction(lo, hi, lower)}
    return out


def run_order(systems: Sequence[str], k: int) -> list[str]:
    """The order the systems run in for seed number ``k``: colocated first (the others' Poisson rates are taken
    from its bursts), the rest rotated by ``k``."""
    from paper_policies import rotated

    rest = [s for s in systems if s != "colocated"]
    return (["colocated"] if "colocated" in systems else []) + rotated(rest, k)


# -- the report ------------------------------------------------------------------------------------------------


def pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:+.0f}%"


def cell(c: Mapping[str, float | str], factor: bool = False) -> str:
    """A comparison's cell: the mean change (perf/$ as a factor) and its interval, then the claim."""
    m, lo, hi = (float(c[k]) for k in ("change", "lo", "hi"))
    if math.isnan(m):
        return "-"
    if factor:
        body = f"{1 + m:.2f}×" + ("" if math.isnan(lo) else f" [{1 + lo:.2f}, {1 + hi:.2f}]")
    else:
        body = pct(m) + ("" if math.isnan(lo) else f" [{pct(lo)}, {pct(hi)}]")
    return f"{body} {c['claim']}"


def paper_cell(w: str) -> str:
    ttft, jct, perf = PAPER[w]
    return " / ".join(["-" if ttft is None else pct(ttft), "-" if jct is None else pct(jct), f"{perf:g}×"])


def cpu_table(data: Mapping[str, Any], top: int = 4) -> list[str]:
    """The report's resource section: per system, the bursts' engine-busy seconds and the server's CPU-seconds
    by process (the ``top`` largest, the rest together) and the load generator's apart, each summed over the
    workloads and averaged over the seeds that recorded it; empty when no run recorded them."""
    sums: dict[str, dict[str, list[float]]] = {}
    for by_workload in data["runs"].values():
        seed_sums: dict[str, dict[str, float]] = {}
        for systems in by_workload.values():
            for name, run in systems.items():
                if "server_cpu_by_process" not in run:
                    continue
                acc = seed_sums.setdefault(name, {})
                for label, cpu in run["server_cpu_by_process"].items():
                    acc[label] = acc.get(label, 0.0) + cpu
                for key in ("engine_busy_s", "client_cpu_s"):
                    acc[key] = acc.get(key, 0.0) + run["burst"][key]
        for name, acc in seed_sums.items():
            for key, v in acc.items():
                sums.setdefault(name, {}).setdefault(key, []).append(v)
    if not sums:
        return []
    lines = [
        "",
        "## Resources over the bursts",
        "",
        "Per system, summed over the workloads' bursts and averaged over the seeds: the engines' busy seconds "
        "(this service: time in engine steps by wall clock; plain vLLM: CPU-seconds of its engine core and model "
        "worker processes, which use a CPU only while busy, up to two a second with two threads), the server's "
        "CPU-seconds by process, and the load generator's apart.",
        "",
        "| system | engine-busy s | server CPU-s | by process | load generator CPU-s |",
        "|---|---|---|---|---|",
    ]
    for name, acc in sums.items():
        mean = {k: statistics.mean(v) for k, v in acc.items()}
        busy, client = mean.pop("engine_busy_s"), mean.pop("client_cpu_s")
        ranked = sorted(mean.items(), key=lambda kv: -kv[1])
        parts = [f"{label} {cpu:.1f}" for label, cpu in ranked[:top]]
        if len(ranked) > top:
            parts.append(f"the rest {sum(c for _, c in ranked[top:]):.1f}")
        lines.append(f"| {name} | {busy:.1f} | {sum(mean.values()):.1f} | {'; '.join(parts)} | {client:.1f} |")
    return lines


def report(data: dict[str, Any]) -> str:
    a = data["args"]
    runs = data["runs"]
    lines = [
        "# TetriInfer §5.1 live: the tetriinfer preset against plain vLLM and against colocated",
        "",
        *provenance(data),
        *(f"Resumed: `{r['command']}` on {r['commit']}, {r['date']}  " for r in data.get("resumed", [])),
        "",
        f"{a['num_prompts']} ShareGPT requests per workload and seed (seeds {', '.join(map(str, a['seeds']))}), each "
        "asking for its answer's length (ignore_eos); the tiny model, one thread per engine; a burst of all "
        f"requests (capacity, CPU-seconds) and Poisson arrivals at {a['load']:g} of the colocated server's burst "
        "capacity (TTFT, JCT). Changes are means over seeds with 95% intervals (Student's t); a direction is "
        "claimed only where the interval excludes zero. perf/$ is output tokens per CPU-second of the server's "
        "process tree over the burst. The paper's figures are against vLLM on GPUs with an emulated 200 Gb/s "
        "link (TTFT / JCT / perf/$). The Poisson run sends the burst's requests again, each prompt led by "
        f"`{TAG.strip()}` so that no system finds it in its prefix cache.",
    ]
    short = sorted(
        {
            f"{w} {int(run['burst']['completed'] + run['burst']['failed'])}"
            for by_workload in runs.values()
            for w, systems in by_workload.items()
            for run in systems.values()
            if run["burst"]["completed"] + run["burst"]["failed"] < a["num_prompts"]
        }
    )
    if short:
        lines[-1] += f" Workloads the ShareGPT file holds fewer usable pairs of, all of which run: {', '.join(short)}."
    done, total = data.get("done", (0, 0))
    if done < total:
        lines += [
            "",
            f"**Cut short: {done} of {total} (seed, workload, system) runs finished; the tables hold those.**",
        ]
    variants = ("tetriinfer-oracle", "tetriinfer-shared")  # also compared with the preset itself
    for ours in [s for s in ("tetriinfer", *variants, "colocated") if s in a["systems"]]:
        bases = (*BASELINES, "colocated", *(("tetriinfer",) if ours in variants else ()))
        for base in [b for b in bases if b in a["systems"] and b != ours]:
            rows = [
                w for w in a["workloads"] if any(w in by and ours in by[w] and base in by[w] for by in runs.values())
            ]
            if not rows:
                continue
            lines += ["", f"## {ours} against {base}", ""]
            lines += ["| workload | TTFT | JCT | perf/$ | the paper (vs vLLM) |", "|---|---|---|---|---|"]
            for w in rows:
                c = compare(runs, w, ours, base)
                lines.append(
                    f"| {w} | {cell(c['ttft'])} | {cell(c['jct'])} | {cell(c['perf'], True)} | {paper_cell(w)} |"
                )
    lines += [
        "",
        f"![each change with its interval, beside the paper's]({Path(a.get('out') or 'tetriinfer_e2e').name}.png)",
    ]
    lines += cpu_table(data)
    lines += ["", "## Every run", ""]
    lines += [
        "| seed | workload | system | capacity req/s | Poisson rate | TTFT ms | JCT ms | server CPU-s | engine-busy s "
        "| perf/$ | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, by_workload in runs.items():
        for w, systems in by_workload.items():
            for name, run in systems.items():
                b, p = run["burst"], run["poisson"]
                busy = f"{b['engine_busy_s']:.1f}" if "engine_busy_s" in b else "-"
                lines.append(
                    f"| {seed} | {w} | {name} | {capacity(b):.2f} | {run['rate']:.2f} | {p['ttft_mean_ms']:.0f} | "
                    f"{p['jct_mean_ms']:.0f} | {b.get('server_cpu_s', math.nan):.1f} | {busy} | "
                    f"{perf_per_cpu(b):.1f} | {int(b['failed'] + p['failed'])} |"
                )
    return "\n".join(lines) + "\n"


# what the figure shows per workload: each pair's change, beside the paper's (which is against vLLM)
PLOTTED = (
    ("tetriinfer", "vllm"),
    ("tetriinfer", "vllm-nochunk"),
    ("tetriinfer", "vllm-2t"),
    ("tetriinfer", "colocated"),
    ("tetriinfer-oracle", "vllm"),
    ("tetriinfer-shared", "vllm"),
)


def plot(data: dict[str, Any], png: Path) -> None:
    """One panel per metric (TTFT, JCT, perf/$): per workload a bar per pair of ``PLOTTED`` that ran, its mean
    relative change over the seeds with the 95% interval, and the paper's change as a black diamond. The axis
    is symmetric-log in percent: the intervals of three seeds span orders of magnitude."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, runs = data["args"], data["runs"]
    pairs = [(o, b) for o, b in PLOTTED if o in a["systems"] and b in a["systems"]]
    workloads = list(a["workloads"])
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5.2 * len(METRICS), 4.2), squeeze=False)
    width = 0.8 / max(len(pairs), 1)
    for col, (key, label, lower, _) in enumerate(METRICS):
        ax = axes[0, col]
        for i, (ours, base) in enumerate(pairs):
            xs, ys, errs = [], [], [[], []]
            for j, w in enumerate(workloads):
                c = compare(runs, w, ours, base)[key]
                m, lo, hi = (100 * float(c[k]) for k in ("change", "lo", "hi"))
                if math.isnan(m):
                    continue
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(m)
                errs[0].append(0.0 if math.isnan(lo) else m - lo)
                errs[1].append(0.0 if math.isnan(hi) else hi - m)
            ax.bar(xs, ys, width, yerr=errs, capsize=2, label=f"{ours} / {base}", error_kw={"linewidth": 0.7})
        paper = [PAPER[w][col] for w in workloads]
        px = [j for j, v in enumerate(paper) if v is not None]
        py = [100 * (v - 1 if key == "perf" else v) for v in paper if v is not None]
        ax.scatter(px, py, marker="D", color="black", zorder=3, label="the paper (vs vLLM)")
        ax.axhline(0, color="gray", linewidth=0.6)
        ax.set_yscale("symlog", linthresh=100)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(f"{label}: change, % ({'lower' if lower else 'higher'} is better)")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"TetriInfer §5.1 live: mean over seeds {', '.join(map(str, a['seeds']))} with 95% intervals")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


# -- running it ------------------------------------------------------------------------------------------------


def server(name: str, model: str, env: dict[str, str], oracle: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment of system ``name`` on ``PORT``."""
    from vllm_bench_serve import tetriserve_cmd, vllm_server

    engines = ["--threads-per-engine", "1", "--num-prefill", "1", "--num-decode", "1", "--max-model-len", "2048"]
    if name == "tetriinfer":
        return tetriserve_cmd("--preset", "tetriinfer", *engines), env
    if name == "tetriinfer-oracle":
        return tetriserve_cmd(
            "--preset", "tetriinfer", *engines, "--predictor", "oracle", "--predictor-workload", str(oracle)
        ), env
    if name == "tetriinfer-shared":
        return tetriserve_cmd("--preset", "tetriinfer", *engines, "--no-reserve-decode-cores"), env
    if name == "colocated":
        return tetriserve_cmd("--mode", "colocated", *engines), env
    threads = 2 if name == "vllm-2t" else 1
    extra = ["--no-enable-chunked-prefill"] if name == "vllm-nochunk" else []
    return vllm_server(model, PORT, env, threads=threads, extra=extra)


def bench(
    name: str, scenario: str, dataset: Path, model: str, n: int, rate: float, seed: int
) -> tuple[dict[str, Any], float]:
    """One run of vLLM's client against ``PORT``: its saved JSON, and the client's own CPU-seconds."""
    from vllm_bench_report import saved
    from vllm_bench_serve import client_command

    load = ["--num-prompts", str(n), "--request-rate", "inf" if math.isinf(rate) else f"{rate:.4f}"]
    cmd = client_command(PORT, model, dataset, f"bench_{name}_{scenario}.json", load, seed, ignore_eos=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return saved(name, scenario), client


def cpu_by_label(before: Mapping[str, tuple[str, float]], after: Mapping[str, tuple[str, float]]) -> dict[str, float]:
    """CPU-seconds each kind of server process used between two ``session_cpu`` readings, by its label (Ray's
    actor names, vLLM's engine process, the serve command), largest first."""
    used: dict[str, float] = {}
    for pid, (label, cpu) in after.items():
        used[label] = used.get(label, 0.0) + cpu - before.get(pid, ("", 0.0))[1]
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))


def engine_busy(name: str, cpu: Mapping[str, tuple[str, float]]) -> float:
    """The engines' busy seconds so far, beside ``cpu`` (a ``session_cpu`` reading of the server taken now): for
    this service the seconds its engines spent in steps (``engine_step_seconds`` by wall clock on ``/metrics``,
    summed over the workers); for plain vLLM the CPU-seconds of its engine processes (``VLLM_ENGINE``: they block
    on their queues when idle, so they use a CPU only while busy; with two threads, up to two a second)."""
    if name.startswith("vllm"):
        return sum(c for label, c in cpu.values() if label in VLLM_ENGINE)
    from vllm_bench_serve import worker_series

    return sum(v for (_, _, clock), v in worker_series(names=("engine_step_seconds",)).items() if clock == "wall")


def serve_system(
    name: str, model: str, env: dict[str, str], files: Mapping[str, Path], oracle: Path, sizes: Mapping[str, int],
    seed: int,
    load: float, bases: Mapping[str, Mapping[str, float]], progress: Callable[[str, str, dict[str, Any]], None],
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Start ``name``, warm it up, then per workload the burst (server CPU measured) and the Poisson run at
    ``load`` of the capacity of burst ``bases[workload]`` (absent: of its own burst). ``files``: the client's
    datasets by ``warmup`` and ``<workload>-burst`` / ``<workload>-poisson``; ``sizes``: each workload's requests."""
    from vllm_bench_serve import serving, session_cpu

    cmd, senv = server(name, model, env, oracle)
    tag = f"{name}_s{seed}"
    out: dict[str, dict[str, Any]] = {}
    with serving(cmd, senv, WORK / f"server_{tag}.log", PORT) as proc:
        bench(tag, "warmup", files["warmup"], model, WARMUP, math.inf, seed)
        for workload in [w for w in files if w != "warmup" and w.endswith("-burst")]:
            w = workload.removesuffix("-burst")
            before = session_cpu(proc.pid)
            busy = engine_busy(name, before)
            result, client_burst = bench(f"{tag}_{w}", "burst", files[workload], model, sizes[w], math.inf, seed)
            after = session_cpu(proc.pid)
            burst = figures(result)
            burst["engine_busy_s"] = engine_busy(name, after) - busy
            by_process = cpu_by_label(before, after)
            burst["server_cpu_s"] = sum(by_process.values())
            burst["client_cpu_s"] = client_burst
            rate = load * capacity(bases.get(w, burst))
            result, client_poisson = bench(f"{tag}_{w}", "poisson", files[f"{w}-poisson"], model, sizes[w], rate, seed)
            poisson = figures(result)
            poisson["client_cpu_s"] = client_poisson
            out[w] = {"burst": burst, "poisson": poisson, "rate": rate, "server_cpu_by_process": by_process}
            progress(name, w, out[w])
    return out


def pool(model: str, need: int) -> list[Pair]:
    """ShareGPT's first exchanges (a record's first human turn and the gpt answer after it), counted by the
    client's tokenizer, read until every workload has ``need`` pairs the client keeps, or the file ends."""
    from transformers import AutoTokenizer

    from tetriserve.common.sharegpt import first_human_prompt, iter_conversations
    from tetriserve.common.workload import answer_after_first_human

    tok = AutoTokenizer.from_pretrained(model)
    out: list[Pair] = []
    found = dict.fromkeys(WORKLOADS[:4], 0)
    for rec in iter_conversations():
        prompt = first_human_prompt(rec)
        answer = answer_after_first_human(rec) if prompt is not None else None
        if prompt is None or answer is None:
            continue
        pair = Pair(prompt, answer, len(tok(prompt).input_ids), len(tok(answer).input_ids))
        out.append(pair)
        if pair.client_keeps:
            found[pair.workload] += 1
            if min(found.values()) >= need:
                break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--num-prompts", type=int, default=128, help="requests per workload (the paper: 128)")
    ap.add_argument("--load", type=float, default=0.7, help="Poisson rate as a share of colocated's burst capacity")
    ap.add_argument("--out", default=str(RESULTS / "tetriinfer_e2e"), help="results stem (.md, .json and .png)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report and plot from the saved JSON")
    ap.add_argument(
        "--resume", action="store_true", help="run --systems on the saved result's seeds and add them to it"
    )
    args = ap.parse_args()
    if args.report_only:
        return write_result(
            Path(args.out), json.loads(Path(args.out).with_suffix(".json").read_text()), report, plot=plot
        )
    if args.resume:
        data = resumed(args, run_facts())
    elif "colocated" not in args.systems:
        ap.error("--systems must include colocated: the Poisson rate is a share of its burst capacity")
    else:
        data = {**run_facts(), "args": vars(args), "runs": {}, "done": [0, 0]}
    from vllm_bench_serve import prepare

    model, _, env = prepare()
    pairs = pool(model, args.num_prompts)
    runs: dict[str, dict[str, dict[str, Any]]] = data["runs"]
    k, total = data["done"][0], data["done"][1] + len(args.seeds) * len(args.workloads) * len(args.systems)
    began = time.monotonic()

    def progress(name: str, workload: str, run: dict[str, Any]) -> None:
        nonlocal k
        k += 1
        print(
            f"[{k}/{total}] seed {seed} {workload:5s} {name:17s} capacity {capacity(run['burst']):.2f} req/s, "
            f"TTFT {run['poisson']['ttft_mean_ms']:.0f} ms, JCT {run['poisson']['jct_mean_ms']:.0f} ms at "
            f"{run['rate']:.2f} req/s; {time.monotonic() - began:.0f} s",
            flush=True,
        )

    def save(echo: bool = True) -> int:
        data["done"] = [k, total]
        return write_result(Path(args.out), data, report, echo, plot)

    for seed in args.seeds:
        d = draw(pairs, args.workloads, args.num_prompts, seed)
        files = {"warmup": WORK / f"tetriinfer_warmup_s{seed}.json"}
        for w in args.workloads:
            files[f"{w}-burst"] = WORK / f"tetriinfer_{w}_burst_s{seed}.json"
            files[f"{w}-poisson"] = WORK / f"tetriinfer_{w}_poisson_s{seed}.json"
        chosen = {"warmup": d.warmup}
        for w in args.workloads:
            chosen |= {f"{w}-burst": d.burst[w], f"{w}-poisson": d.poisson[w]}
        for key, path in files.items():
            path.write_text(json.dumps(sharegpt_file(chosen[key])))
        oracle = WORK / f"tetriinfer_oracle_s{seed}.jsonl"
        oracle.write_text("\n".join(oracle_lines(d.every())) + "\n")
        by_workload = runs.setdefault(str(seed), {w: {} for w in args.workloads})
        for name in run_order(args.systems, seed):
            bases = {w: by_workload[w]["colocated"]["burst"] for w in args.workloads if "colocated" in by_workload[w]}
            served = serve_system(
                name,
                model,
                env,
                files,
                oracle,
                {w: len(d.burst[w]) for w in args.workloads},
                seed,
                args.load,
                bases,
                progress,
            )
            for w in args.workloads:
                by_workload[w][name] = served[w]
            if k < total:  # what has run so far, so that a run cut short still leaves its figures
                save(echo=False)
    return save()


SAME_RUN = ("workloads", "num_prompts", "load")  # what a resumed run must share with the saved one


def resumed(args: argparse.Namespace, facts: dict[str, str]) -> dict[str, Any]:
    """The result at ``--out`` to go on with: ``--systems`` run on its seeds (``--seeds``, each one it holds) at
    the Poisson rates its colocated bursts give, replacing what it held of them. Its workloads, sizes and load
    must be this run's; the resuming run's facts are added under ``resumed``."""
    data: dict[str, Any] = json.loads(Path(args.out).with_suffix(".json").read_text())
    differ = [key for key in SAME_RUN if data["args"].get(key) != getattr(args, key)]
    if differ:
        raise SystemExit(f"--resume: the saved run differs in {', '.join(differ)}")
    missing = [s for s in args.seeds if "colocated" not in data["runs"].get(str(s), {}).get(args.workloads[0], {})]
    if missing:
        raise SystemExit(f"--resume: no colocated bursts for seeds {missing}, whose capacity sets the Poisson rates")
    data["args"]["systems"] = list(dict.fromkeys([*data["args"]["systems"], *args.systems]))
    data.setdefault("resumed", []).append(facts)
    return data


if __name__ == "__main__":
    sys.exit(main())
