"""The report of ``vllm_bench_serve.py``: the benchmark client's saved runs, summarised, compared, judged.

Each run of a system in a scenario and round is the client's JSON under
``benchmarks/_work``; the report takes the median of each system's rounds, the
median of the per-round ratios (tetriserve / vLLM) with every round's listed,
judges the targets (``TARGETS``) on that median, and pools TTFT by prompt length. From
the per-request runs, which it keeps as ``<out>_per_request.json``, it splits TPOT
at 2 req/s at the second token and shows the response that ended last at saturation.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench_results import RESULTS, ROOT, WORK, code_state, provenance

METRICS = [
    "completed",
    "failed",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "median_e2el_ms",
    "median_e2el_per_token_ms",
    "cpu_cores",
]


def checkout_env(commit: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a server that runs the code of ``commit`` instead of the working tree's: a detached worktree of
    it under ``_work/code_<commit>``, and beside it a ``tetriserve`` folder linking each of its packages (the
    package-dir mapping of its ``pyproject.toml``), put first on ``PYTHONPATH``. Ray's workers inherit that
    path, so every process of the server imports the commit's code; the installed environment stays as it is."""
    tree = WORK / f"code_{commit}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True)
    links = WORK / f"code_{commit}.path"
    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in mapping.items():
        link = links.joinpath(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(tree / folder)
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(links), env.get("PYTHONPATH", "")])))


def add_code_option(ap: argparse.ArgumentParser) -> None:
    """``--code NAME=COMMIT``: variant ``NAME``'s server runs ``COMMIT``'s code (``variant_envs``)."""
    ap.add_argument("--code", action="append", default=[], help="NAME=COMMIT: variant NAME's server runs COMMIT's code")


def code_of(args: argparse.Namespace) -> dict[str, str]:
    """Variant name -> commit, from ``--code``."""
    return dict(c.split("=", 1) for c in args.code)


def variant_envs(args: argparse.Namespace, names: Iterable[str], env: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each variant's server environment: ``env``, or ``checkout_env`` for a variant named by ``--code``."""
    names, commits = list(names), code_of(args)
    unknown = sorted(set(commits) - set(names))
    if unknown:
        raise SystemExit(f"--code names no variant: {', '.join(unknown)}")
    return {n: checkout_env(commits[n], env) if n in commits else env for n in names}


def code_line(args: argparse.Namespace) -> str:
    """A report's ``Code:`` line: the working tree's commit, and each ``--code`` variant's."""
    return f"Code: {code_state()}" + "".join(f"; variant `{n}` on commit {c}" for n, c in code_of(args).items()) + "  "


def report_head(out: str, title: str, script: str, result: dict[str, Any]) -> list[str]:
    """Write ``result`` to ``benchmarks/results/<out>.json``; the Markdown report's first lines: ``title``, the
    command that ran ``script`` (``result["command"]``) and the code (``result["code"]``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
    command = " ".join(shlex.quote(a) for a in result["command"])
    return [f"# {title}", "", f"Command: `python benchmarks/{script} {command}`  ", f"Code: {result['code']}  "]


SCENARIOS = ("rate", "single", "saturation")
WARMUP_PROMPTS = 64


def saved(name: str, scenario: str) -> dict[str, Any]:
    """The benchmark client's saved JSON of ``name``'s run of ``scenario`` (summary and per-request detail)."""
    result: dict[str, Any] = json.loads((WORK / f"bench_{name}_{scenario}.json").read_text())
    return result


def summary(name: str, scenario: str) -> dict[str, float]:
    result = saved(name, scenario)
    out = {k: float(result[k]) for k in METRICS if k in result}
    # a request's whole latency over its output tokens: the per-token cost a client sees whether the server
    # streams token by token or delivers a burst (then TPOT, counted after the first chunk, reads near 0)
    pairs = zip(result.get("latencies", []), result.get("output_lens", []), strict=True)
    per_token = [lat / n for lat, n in pairs if n]
    if per_token:
        out["median_e2el_per_token_ms"] = 1000 * statistics.median(per_token)
    cpu = cpu_of(name, scenario)
    if cpu is not None:
        out["cpu_cores"] = sum(cpu.values())
    return out


def cpu_of(name: str, scenario: str) -> dict[str, float] | None:
    """Cores each of the server's processes used over the run (``vllm_bench_serve.cpu_by_process``), if recorded."""
    path = WORK / f"cpu_{name}_{scenario}.json"
    return json.loads(path.read_text()) if path.exists() else None


PROMPT_BANDS = ((0, 50), (50, 150), (150, 400), (400, 1 << 20))


def band_label(lo: int, hi: int) -> str:
    """A ``PROMPT_BANDS`` band as the reports name it: ``0–49``, ``≥ 400``."""
    return f"{lo}–{hi - 1}" if hi < 1 << 20 else f"≥ {lo}"


def ttft_by_prompt(names: list[str], scenario: str) -> list[tuple[int, float]]:
    """Per band of prompt length (``PROMPT_BANDS``): (requests, median TTFT in ms) over the runs saved under
    ``names``, from the detailed JSON."""
    runs = [saved(name, scenario) for name in names]
    pairs = [p for run in runs for p in zip(run["ttfts"], run["input_lens"], strict=True)]
    rows = []
    for lo, hi in PROMPT_BANDS:
        ttfts = [t for t, n in pairs if lo <= n < hi]
        rows.append((len(ttfts), 1000 * statistics.median(ttfts) if ttfts else float("nan")))
    return rows


TARGETS = (  # tetriserve / vLLM: (scenario, metric, bound, "max" = ratio at most, "min" = at least)
    ("rate", "median_ttft_ms", 1.5, "max"),
    ("rate", "median_tpot_ms", 1.2, "max"),
    ("single", "median_tpot_ms", 1.2, "max"),
    ("saturation", "output_throughput", 1.0, "min"),
)


def run_name(system: str, rnd: int) -> str:
    """The name a system's runs of round ``rnd`` are saved under in ``WORK``."""
    return f"{system}_r{rnd}"


TITLES = {
    "rate": "Poisson arrivals at {request_rate} req/s, {num_prompts} prompts",
    "single": "one stream at a time (max concurrency 1), {single_prompts} prompts",
    "saturation": "all {num_prompts} prompts at once (request rate inf): throughput at saturation",
}


def ratios(t: list[dict[str, float]], v: list[dict[str, float]], metric: str) -> list[float]:
    """tetriserve / vLLM for ``metric`` in each round (rounds where vLLM's value is 0 are left out)."""
    return [a[metric] / b[metric] for a, b in zip(t, v, strict=True) if metric in a and b.get(metric)]


def median_of(runs: list[dict[str, float]], metric: str) -> float:
    return statistics.median(r[metric] for r in runs)


def write_report(
    results: dict[str, dict[str, list[dict[str, float]]]], args: argparse.Namespace, facts: dict[str, Any]
) -> None:
    """The report ``<out>.md``, its figures ``<out>.json`` (arguments, the run's ``facts``, every run's summary)
    and ``<out>_per_request.json``; ``facts``: the run's command, machine, commit and date (``run_facts``)."""
    from tetriserve.engine.settings import engine_dtype

    data = {"args": vars(args), "facts": facts, "results": results}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(data, indent=2))
    eos = getattr(args, "ignore_eos", False)
    rounds = args.rounds
    lines = [
        "# vLLM benchmark client: tetriserve vs plain vLLM",
        "",
        *provenance(facts),
        f"Client: `vllm.benchmarks.serve --backend openai --dataset-name sharegpt --seed {args.seed}"
        f"{' --ignore-eos' if eos else ''}`"
        + (
            " (every request generates its dataset output length on both systems)"
            if eos
            else " (a sampled EOS may end a response before its dataset length, at random on either system)"
        )
        + f"; "
        f"{rounds} rounds; in each, every scenario on a fresh server of each system, the two back to back, which one "
        f"goes first alternating; each server first serves {WARMUP_PROMPTS} prompts at once, not measured; "
        "a server starts only once every process of the one before has exited.  ",
        "No GPU; tiny random-weight Llama (5.2M params), "
        f"same for both, in dtype `{engine_dtype('auto')}` (tetriserve's default here, passed to plain vLLM).  ",
        f"tetriserve: defaults{' plus `' + args.tetriserve_flags + '`' if args.tetriserve_flags else ''} "
        "(1 prefill + 1 decode worker, trained length predictor), 1 OMP thread per engine, "
        "KV over the default transport (`auto`: shared memory). "
        "vLLM: one `vllm.entrypoints.openai.api_server`, 2 OMP threads.  ",
        "Each system's column is the median of its rounds; the ratio is the median of the per-round ratios "
        "(tetriserve / vLLM), each round's listed after it.",
    ]
    binding = [
        ln.split("]", 1)[-1].strip()
        for ln in (WORK / f"server_{run_name('vllm', 0)}_{SCENARIOS[0]}.log").read_text().splitlines()
        if "core ids=" in ln or "reserved_cpus=" in ln
    ]
    if binding:
        lines.append(f"vLLM's own CPU binding (from its log): {'; '.join(binding)}.")
    lines += ["", "## The targets, on the median of the per-round ratios", ""]
    lines += [
        "| scenario | metric | target | ratio (median) | rounds that meet it | met |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for scenario, metric, bound, kind in TARGETS:
        rs = ratios(results["tetriserve"][scenario], results["vllm"][scenario], metric)
        ok = [r <= bound if kind == "max" else r >= bound for r in rs]
        mid = statistics.median(rs) if rs else float("nan")
        met = (mid <= bound) if kind == "max" else (mid >= bound)
        sign = "≤" if kind == "max" else "≥"
        verdict = "yes" if met else "no"
        lines.append(f"| {scenario} | {metric} | {sign} {bound} | {mid:.2f} | {sum(ok)} of {len(rs)} | {verdict} |")
    single = ratios(results["tetriserve"]["single"], results["vllm"]["single"], "median_e2el_per_token_ms")
    if single:
        lines += [
            "",
            "At one stream plain vLLM often sends a response in one or a few chunks: its TTFT then holds the "
            "generation and its TPOT, counted after the first chunk, reads near 0, so the TPOT ratio compares a "
            "stream with a burst. The per-token cost a client sees either way, the median of latency / output "
            f"tokens (`median_e2el_per_token_ms`), is {statistics.median(single):.2f}× plain vLLM's "
            f"(rounds: {', '.join(f'{r:.2f}' for r in single)}).",
        ]
    for scenario in SCENARIOS:
        t, v = results["tetriserve"][scenario], results["vllm"][scenario]
        lines += ["", f"## {TITLES[scenario].format(**vars(args))}", ""]
        lines += [
            "| metric | tetriserve | vLLM | tetriserve / vLLM | per round |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for k in METRICS:
            if all(k in r for r in t + v):
                rs = ratios(t, v, k)
                mid = f"{statistics.median(rs):.2f}" if rs else "-"
                each = ", ".join(f"{r:.2f}" for r in rs) or "-"
                lines.append(f"| {k} | {median_of(t, k):.2f} | {median_of(v, k):.2f} | {mid} | {each} |")
    lines += ["", f"## Median TTFT by prompt length, {TITLES['rate'].format(**vars(args))}, all rounds pooled", ""]
    lines += [
        "| prompt tokens | requests | tetriserve ms | vLLM ms | tetriserve / vLLM |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    bands = {n: ttft_by_prompt([run_name(n, r) for r in range(rounds)], "rate") for n in ("tetriserve", "vllm")}
    for (lo, hi), (n, t_ms), (_, v_ms) in zip(PROMPT_BANDS, bands["tetriserve"], bands["vllm"], strict=True):
        lines.append(f"| {band_label(lo, hi)} | {n} | {t_ms:.0f} | {v_ms:.0f} | {t_ms / v_ms:.2f} |")
    kept = {scenario: per_request_runs(rounds, scenario) for scenario in ("rate", "saturation")}
    lines += tpot_split_section(kept["rate"], TITLES["rate"].format(**vars(args)))
    lines += last_response_section(kept["saturation"])
    lines += cpu_section(TITLES["rate"].format(**vars(args)))
    (RESULTS / f"{args.out}_per_request.json").write_text(json.dumps(kept))
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def per_request_runs(rounds: int, scenario: str) -> dict[str, dict[str, list[float]]]:
    """Per round and system (``"<system> <round>"``), a run's per-request output tokens, TTFT, latency and wait
    from the first token to the second (``first_itls``, 0 for one-token responses), in the client's request
    order: what the sections below read, small enough to keep beside the report."""
    runs = {}
    for r in range(rounds):
        for n in ("tetriserve", "vllm"):
            run = saved(run_name(n, r), scenario)
            runs[f"{n} {r + 1}"] = {k: run[k] for k in ("output_lens", "ttfts", "latencies")}
            runs[f"{n} {r + 1}"]["first_itls"] = [itl[0] if itl else 0.0 for itl in run["itls"]]
    return runs


def tpot_split_section(runs: dict[str, dict[str, list[float]]], title: str) -> list[str]:
    """TPOT split in two, per run (``per_request_runs`` of the rate scenario): the wait from a response's first
    token to its second (on tetriserve the handoff from the prefill worker to the decode worker) and the time per
    token after the second; medians over the responses of three tokens or more."""
    lines = ["", f"## TPOT split at the second token, {title}", ""]
    lines += [
        "| run | median TPOT ms | median first → second token ms | median per token after the second ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, run in runs.items():
        tpot, first, after = [], [], []
        for n, ttft, lat, gap in zip(
            run["output_lens"], run["ttfts"], run["latencies"], run["first_itls"], strict=True
        ):
            if n >= 3:
                tpot.append((lat - ttft) / (n - 1))
                first.append(gap)
                after.append((lat - ttft - gap) / (n - 2))
        if tpot:
            med = [1e3 * statistics.median(x) for x in (tpot, first, after)]
            lines.append(f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} |")
    return lines


def last_response_section(runs: dict[str, dict[str, list[float]]]) -> list[str]:
    """At saturation a run lasts until its last response ends, so throughput (output tokens over that time)
    hangs on that one request: per run (``per_request_runs`` of the saturation scenario), which it was, its
    output tokens, its TTFT and its end (and, where the runs kept it, its wait from the first token to the
    second: on tetriserve a request prefilled before the decode engine has a slot for it waits there), and how
    many responses a sampled EOS ended before the longest length any run gave the same prompt."""
    longest = [max(lens) for lens in zip(*(run["output_lens"] for run in runs.values()), strict=True)]
    gaps = all("first_itls" in run for run in runs.values())
    lines = ["", "## At saturation, the response that ended last", ""]
    lines += [
        "| run | output tokens | responses cut short | last: request | its tokens | its TTFT s | "
        + ("first → second token s | " if gaps else "")
        + "ends at s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if gaps else ""),
    ]
    for name, run in runs.items():
        lens, lat = run["output_lens"], run["latencies"]
        last = max(range(len(lat)), key=lat.__getitem__)
        cut = sum(1 for got, most in zip(lens, longest, strict=True) if got < most)
        gap = f" {run['first_itls'][last]:.2f} |" if gaps else ""
        ttft = run["ttfts"][last]
        lines.append(f"| {name} | {sum(lens)} | {cut} | {last} | {lens[last]} | {ttft:.2f} |{gap} {lat[last]:.1f} |")
    return lines


def cpu_section(title: str) -> list[str]:
    """Where each server's CPU went in the first round's rate run: cores per process (CPU seconds over the
    client's whole run, its start-up included, so idle time dilutes them a little alike for both)."""
    runs = {n: cpu_of(run_name(n, 0), "rate") for n in ("tetriserve", "vllm")}
    if any(cpu is None for cpu in runs.values()):
        return []
    lines = ["", f"## CPU by process, {title}, first round", ""]
    lines += ["| system | process | cores |", "| --- | --- | ---: |"]
    for n, cpu in runs.items():
        assert cpu is not None
        lines += [f"| {n} | {label} | {cores:.2f} |" for label, cores in cpu.items()]
        lines.append(f"| {n} | **all** | **{sum(cpu.values()):.2f}** |")
    return lines


if __name__ == "__main__":  # the sections read from per-request runs kept as JSON (``per_request_runs``)
    kept = json.loads(Path(sys.argv[1]).read_text())
    if "rate" in kept:
        print("\n".join(tpot_split_section(kept["rate"], "Poisson arrivals")))
    print("\n".join(last_response_section(kept["saturation"])))
