"""Each preset against plain vLLM under per-request SLOs: attainment per objective and goodput as DistServe
defines it, at three SLO scales.

Goodput (DistServe §2): the highest request rate at which at least ``--target`` (90%) of the requests meet all
their SLOs. It is found per system and SLO scale by a search over the Poisson rate on one running server: from
``--start-rate`` the rate doubles until a point misses the target (or halves until one meets it), then the
bracket is bisected ``--steps`` times; every point sends ``--requests`` (at least 300) requests. The result is a
bracket [highest rate that met, lowest that missed], given per engine thread (our systems run two one-thread
engines, plain vLLM one).

Every server first serves ``WARMUP`` requests at once, not measured. SLOs per request, as multiples of its
unloaded latency here: before anything else is measured, plain vLLM (one thread) serves ``--calibration``
requests one at a time, each ``CALIBRATION_TRIES`` times, and takes each one's fastest try whose tokens came
one an event (``Outcome.streamed``); from them

    TTFT₀(p) = a + b·p          least squares over the prompt length p
    TBT₀     = the median of the requests' mean gaps between tokens

and a request of prompt p and n output tokens gets, at scale s (``--scales``; DistServe's "SLO scale") and base
multiple M (``--multiple``, 5):

    TTFT ≤ s·M·TTFT₀(p)     TBT ≤ s·M·TBT₀     JCT ≤ s·M·(TTFT₀(p) + (n − 1)·TBT₀)

Our systems get these objectives on the request (the ``slo`` field), so the SLO-aware policies read them; plain
vLLM ignores them and is judged on the same. Systems (``--systems``): ``vllm`` (plain vLLM, one engine thread)
and ``<preset>-<mode>`` for every preset in each mode it serves (``tetriinfer-disaggregated``,
``accelgen-colocated``, ...), each 1 prefill + 1 decode engine or two colocated engines of one thread, and
``tetriinfer-shared-disaggregated``: the preset with every core shared instead of one kept for the decode
engine (``VARIANTS``; not in the default set, which is the presets as written). Each point
resends the workload with two leading token ids unique to the point (scale, rate), so no point finds another's
prompts in a prefix cache. Workload: ShareGPT first-turn prompts (``paper_policies.sharegpt_pairs``: at most
``--max-prompt`` tokens, ``max_tokens`` the answer's length capped at ``--max-tokens``), ignore_eos, greedy; the
same requests and arrival times for every system at a given rate. Our systems read one cost profile
(``--cost-profile``, else one ``tetriserve profile`` run at the start), which AccelGen's and SOLA's policies need.

Per point: attainment of TTFT, TBT, JCT and all three; p50 and p99 of TTFT, TPOT (a request's mean gap) and JCT;
preemptions (the servers' ``*preemptions_total`` counters over the point).

    python benchmarks/slo_goodput.py
    python benchmarks/slo_goodput.py --systems vllm tetriinfer-disaggregated --scales 1   # one pair, one scale

Writes ``benchmarks/results/slo_goodput.{md,json,png}`` (``--out``), saved after every point; a line per point;
``--report-only`` rewrites the report and the plot from the saved JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import RESULTS, WORK, provenance, run_facts, write_result  # noqa: E402

MODEL_NAME = "tiny-llama"
PORT = 8100
PRESET_MODES: dict[str, tuple[str, ...]] = {
    "tetriinfer": ("disaggregated",),
    "accelgen": ("colocated", "disaggregated"),
    "sola": ("colocated", "disaggregated"),
    "scls": ("colocated", "disaggregated"),
    "cacheopt": ("colocated", "disaggregated"),
}
# a preset with flags of its own, named for them: the tetriinfer preset with every core shared (its decode engine
# at niceness 5, below the prefill engine's) instead of a core kept for the decode engine
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {"tetriinfer-shared": ("tetriinfer", ("--no-reserve-decode-cores",))}
VARIANT_SYSTEMS = tuple(f"{v}-{m}" for v, (p, _) in VARIANTS.items() for m in PRESET_MODES[p])
SYSTEMS = ("vllm", *(f"{p}-{m}" for p, modes in PRESET_MODES.items() for m in modes), *VARIANT_SYSTEMS)
THREADS = {"vllm": 1}  # engine threads per system; every other system: 2
WARMUP = 32  # requests each server serves at once, not measured, before its first measured request
CALIBRATION_TRIES = 3  # tries of each calibration request; the fastest one that streamed is its sample
STREAMED_SHARE = 0.9  # events per token of a stream that came token by token


# -- SLOs from the unloaded latency (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Unloaded:
    """A request's latency alone on the machine: TTFT₀(p) = a_s + b_s·p, and one TBT₀."""

    ttft_a_s: float
    ttft_b_s: float
    tbt_s: float

    def ttft(self, prompt_tokens: int) -> float:
        return self.ttft_a_s + self.ttft_b_s * prompt_tokens

    def slo_ms(self, prompt_tokens: int, output_tokens: int, scale: float, multiple: float) -> dict[str, float]:
        k = 1e3 * scale * multiple
        ttft = self.ttft(prompt_tokens)
        return {
            "ttft_ms": k * ttft,
            "tbt_ms": k * self.tbt_s,
            "jct_ms": k * (ttft + (output_tokens - 1) * self.tbt_s),
        }


def fit_unloaded(samples: Sequence[tuple[int, float, float | None]]) -> Unloaded:
    """(prompt tokens, TTFT s, mean gap s or None) of requests served one at a time -> the least-squares line of
    TTFT on prompt length (slope at least 0) and the median gap; ValueError under two distinct lengths."""
    xs = [float(p) for p, _, _ in samples]
    ys = [t for _, t, _ in samples]
    gaps = [g for _, _, g in samples if g is not None]
    if len(set(xs)) < 2 or not gaps:
        raise ValueError("calibration needs two prompt lengths at least and one request of two tokens")
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs))
    return Unloaded(my - slope * mx, slope, statistics.median(gaps))


# -- one point's outcomes (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    wanted: int  # max_tokens
    tokens: int  # received
    ttft_s: float | None
    tpot_s: float | None  # mean gap between tokens; None under two tokens
    jct_s: float | None
    error: str | None = None
    chunks: int = 0  # stream events that carried text

    @property
    def complete(self) -> bool:
        return self.error is None and self.tokens == self.wanted

    @property
    def streamed(self) -> bool:
        """Whether its tokens came about one an event: a server that falls behind its engine sends the tokens
        made meanwhile in one event, and such a stream's TTFT and gaps are the server's delay, not the engine's."""
        return self.complete and self.chunks >= STREAMED_SHARE * self.tokens

    def met(self, slo: Mapping[str, float]) -> dict[str, bool]:
        """Which objectives this request met (an incomplete request meets none; one token has no gap to miss)."""
        ok = self.complete
        ttft = ok and self.ttft_s is not None and 1e3 * self.ttft_s <= slo["ttft_ms"]
        tbt = ok and (self.tpot_s is None or 1e3 * self.tpot_s <= slo["tbt_ms"])
        jct = ok and self.jct_s is not None and 1e3 * self.jct_s <= slo["jct_ms"]
        return {"ttft": ttft, "tbt": tbt, "jct": jct, "all": ttft and tbt and jct}


def percentile(xs: Sequence[float], q: float) -> float:
    from paper_policies import percentile as pct

    return pct(xs, q)


def summarize(outcomes: Sequence[Outcome], slos: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A point's attainment per objective (over every request sent) and its latency percentiles (over the
    complete ones)."""
    n = len(outcomes)
    met = [o.met(s) for o, s in zip(outcomes, slos, strict=True)]
    done = [o for o in outcomes if o.complete]
    out = {f"attain_{k}": sum(m[k] for m in met) / n if n else math.nan for k in ("ttft", "tbt", "jct", "all")}
    for key, values in (
        ("ttft", [o.ttft_s for o in done if o.ttft_s is not None]),
        ("tpot", [o.tpot_s for o in done if o.tpot_s is not None]),
        ("jct", [o.jct_s for o in done if o.jct_s is not None]),
    ):
        out[f"{key}_p50_ms"] = 1e3 * percentile(values, 50)
        out[f"{key}_p99_ms"] = 1e3 * percentile(values, 99)
    out["requests"], out["incomplete"] = float(n), float(n - len(done))
    return out


# -- the goodput search (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bracket:
    """The highest rate found to meet the target and the lowest found to miss it (None: none found)."""

    met: float | None
    missed: float | None


def search(
    probe: Callable[[float], float], start: float, steps: int, target: float = 0.9, floor: float = 0.05,
    ceiling: float = 1e3,
) -> Bracket:  # fmt: skip
    """Goodput's bracket for a ``probe`` giving the all-SLO attainment at a rate: doubling from ``start`` until a
    miss (halving until a meet, down to ``floor``; up to ``ceiling``), then ``steps`` bisections."""
    met: float | None = None
    missed: float | None = None
    rate = start
    if probe(rate) >= target:
        met = rate
        while rate * 2 <= ceiling:
            rate *= 2
            if probe(rate) < target:
                missed = rate
                break
            met = rate
    else:
        missed = rate
        while rate / 2 >= floor:
            rate /= 2
            if probe(rate) >= target:
                met = rate
                break
            missed = rate
    if met is None or missed is None:
        return Bracket(met, missed)
    for _ in range(steps):
        mid = (met + missed) / 2
        if probe(mid) >= target:
            met = mid
        else:
            missed = mid
    return Bracket(met, missed)


# -- the workload ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    offset_s: float
    prompt: tuple[int, ...]
    max_tokens: int


def arrivals(pairs: Sequence[tuple[tuple[int, ...], int]], rate: float, seed: int, point: int) -> list[Arrival]:
    """The requests of one point: every pair in order, Poisson offsets at ``rate`` (seeded by ``seed`` and the
    rate, the same for every system), each prompt led by two token ids unique to ``point`` (no prefix-cache hit
    across points; ids 100-3099 of the tiny model's 4,096)."""
    from tetriserve.common.workload import poisson

    offsets = poisson(rate, len(pairs), random.Random(f"{seed}-{rate:.6f}"))
    lead = (100 + point % 3000, 100 + (point // 3000) % 3000)
    return [Arrival(t, (*lead, *ids), n) for t, (ids, n) in zip(offsets, pairs, strict=True)]


def warmup_arrivals(pairs: Sequence[tuple[tuple[int, ...], int]], n: int = WARMUP) -> list[Arrival]:
    """The warm-up: the first ``n`` pairs at once, each prompt led by an id of 4000-4095 (a point's lead ids are
    100-3099, the calibration's 3100-3999), so that no measured request finds a warm-up prompt cached."""
    return [Arrival(0.0, (4000 + i % 96, 4001, *ids), out) for i, (ids, out) in enumerate(pairs[:n])]


# -- talking to a server ---------------------------------------------------------------------------------------


async def _one(client: Any, a: Arrival, start: float, slo: Mapping[str, float] | None) -> Outcome:
    await asyncio.sleep(max(0.0, start + a.offset_s - time.monotonic()))
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": list(a.prompt),
        "max_tokens": a.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if slo is not None:
        body["slo"] = dict(slo)
    sent = time.monotonic()
    first = last = None
    tokens, chunks, error = 0, 0, None
    try:
        async with client.stream("POST", f"http://127.0.0.1:{PORT}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return Outcome(len(a.prompt), a.max_tokens, 0, None, None, None, f"HTTP {r.status_code}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    chunks += 1
                    last = time.monotonic()
                    first = first if first is not None else last
    except Exception as exc:  # a failed request misses every objective
        error = f"{type(exc).__name__}: {exc}"
    tpot = (last - first) / (tokens - 1) if first is not None and last is not None and tokens > 1 else None
    return Outcome(
        len(a.prompt), a.max_tokens, tokens,
        None if first is None else first - sent, tpot, None if last is None else last - sent, error, chunks,
    )  # fmt: skip


def send(points: Sequence[Arrival], slos: Sequence[Mapping[str, float]] | None, timeout_s: float) -> list[Outcome]:
    """Send every arrival at its offset (with its SLO when ``slos``) and read each stream to its end."""
    import httpx

    async def run() -> list[Outcome]:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=30)) as client:
            start = time.monotonic()
            tasks = [_one(client, a, start, None if slos is None else slos[i]) for i, a in enumerate(points)]
            return list(await asyncio.gather(*tasks))

    return asyncio.run(run())


def preemptions() -> float:
    """The server's preemptions so far: the sum of every ``*preemptions_total`` sample on ``/metrics``."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if not line.startswith("#") and "preemptions_total" in line.split("{")[0].split(" ")[0]
    )


def server(
    name: str, model: str, env: dict[str, str], profile: str, scls_profile: bool
) -> tuple[list[str], dict[str, str]]:
    """The server of system ``name``; ours read the run's cost profile (AccelGen's and SOLA's cost models,
    SCLS's eq. 3/4 where the profile has that section), as ``paper_policies.py``'s configurations do."""
    from vllm_bench_serve import tetriserve_cmd, vllm_server

    if name == "vllm":
        return vllm_server(model, PORT, env, threads=1)
    preset, mode = name.rsplit("-", 1)
    preset, flags = VARIANTS.get(preset, (preset, ()))
    engines = ["--threads-per-engine", "1", "--num-prefill", "1", "--num-decode", "1", "--max-model-len", "2048"]
    costs = ["--set", f"prefill.cost_profile={profile}"]
    if preset == "scls" and scls_profile:
        costs += ["--set", f"decode.admission.cost_profile={profile}"]
    return tetriserve_cmd("--preset", preset, "--mode", mode, *engines, *costs, *flags), env


# -- the report ------------------------------------------------------------------------------------------------


def per_thread(x: float | None, threads: int) -> str:
    return "-" if x is None else f"{x / threads:.2f}"


def report(data: dict[str, Any]) -> str:
    a, u = data["args"], data.get("unloaded")
    lines = [
        "# Goodput under per-request SLOs: each preset against plain vLLM",
        "",
        *provenance(data),
        *(f"Resumed: `{r['command']}` on {r['commit']}, {r['date']}  " for r in data.get("resumed", [])),
        "",
        f"{a['requests']} ShareGPT requests a point (seed {a['seed']}; prompts cut at {a['max_prompt']} tokens, "
        f"max_tokens the answer's length capped at {a['max_tokens']}), ignore_eos; the tiny model, one thread per "
        f"engine. Goodput: the highest Poisson rate at which {100 * a['target']:.0f}% of requests meet all of "
        "their TTFT, TBT and JCT objectives, found by doubling then bisecting the rate; shown as the bracket "
        "[met, missed] in requests per second per engine thread.",
    ]
    if "profile" in data:
        from paper_policies import profile_text

        lines[-1] += f" Our systems' cost profile: {profile_text(data['profile'])}."
    if u:
        lines[-1] += (
            f" Unloaded latency (plain vLLM, one request at a time): TTFT₀ = {1e3 * u['ttft_a_s']:.1f} ms + "
            f"{1e6 * u['ttft_b_s']:.1f} µs per prompt token, TBT₀ = {1e3 * u['tbt_s']:.2f} ms; SLOs at scale s are "
            f"s × {a['multiple']:g} × these; each calibration request's fastest of {CALIBRATION_TRIES} tries that "
            f"came token by token ({data.get('calibration_left_out', 0)} of {a['calibration']} never did and are "
            "left out)."
        )
    missing = [n for n in a["systems"] if n not in data["systems"]]
    if missing:
        lines.append(f"Not run yet (`--resume --systems {' '.join(missing)}` goes on): {', '.join(missing)}.")
    lines += ["", "| system | " + " | ".join(f"scale {s:g}" for s in a["scales"]) + " |"]
    lines.append("|---|" + "---|" * len(a["scales"]))
    for name, by_scale in data["systems"].items():
        threads = THREADS.get(name, 2)
        cells = []
        for s in a["scales"]:
            b = by_scale.get(f"{s:g}", {}).get("bracket")
            cells.append("-" if b is None else f"[{per_thread(b['met'], threads)}, {per_thread(b['missed'], threads)}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"![SLO attainment against rate, per scale]({Path(a.get('out') or 'slo_goodput').name}.png)"]
    lines += [
        "",
        "## Every point",
        "",
        "| system | scale | rate req/s | all met | TTFT met | TBT met | JCT met | TTFT p50/p99 ms | TPOT p50/p99 ms "
        "| JCT p50/p99 ms | preemptions | incomplete |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_scale in data["systems"].items():
        for s, run in by_scale.items():
            for p in run["points"]:
                lines.append(
                    f"| {name} | {s} | {p['rate']:.2f} | {p['attain_all']:.0%} | {p['attain_ttft']:.0%} | "
                    f"{p['attain_tbt']:.0%} | {p['attain_jct']:.0%} | "
                    f"{p['ttft_p50_ms']:.0f} / {p['ttft_p99_ms']:.0f} | "
                    f"{p['tpot_p50_ms']:.1f} / {p['tpot_p99_ms']:.1f} | "
                    f"{p['jct_p50_ms']:.0f} / {p['jct_p99_ms']:.0f} | {p['preemptions']:.0f} | {p['incomplete']:.0f} |"
                )
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    """One panel per SLO scale, as DistServe draws it: per system the share of requests meeting all their SLOs
    against the Poisson rate per engine thread, every point the search measured, and the target as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = data["args"]
    scales = [f"{s:g}" for s in a["scales"]]
    fig, axes = plt.subplots(1, len(scales), figsize=(6.2 * len(scales), 4.4), squeeze=False)
    for ax, scale in zip(axes[0], scales, strict=True):
        for name, by_scale in data["systems"].items():
            points = sorted(by_scale.get(scale, {}).get("points", []), key=lambda p: p["rate"])
            if not points:
                continue
            threads = THREADS.get(name, 2)
            style = "--" if name.endswith("-colocated") else "-"
            ax.plot(
                [p["rate"] / threads for p in points],
                [100 * p["attain_all"] for p in points],
                style,
                marker="o",
                markersize=3,
                linewidth=1.5 if name == "vllm" else 1,
                color="black" if name == "vllm" else None,
                label=name,
            )
        ax.axhline(100 * a["target"], color="gray", linewidth=0.7, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 102)
        ax.set_xlabel("requests per second per engine thread")
        ax.set_ylabel("requests meeting all SLOs, %")
        ax.set_title(f"SLO scale {scale}")
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


# -- running it ------------------------------------------------------------------------------------------------


def spread(pairs: Sequence[tuple[tuple[int, ...], int]], n: int) -> list[tuple[tuple[int, ...], int]]:
    """``n`` of the pairs spread evenly over their prompt lengths, shortest first."""
    ordered = sorted(pairs, key=lambda p: len(p[0]))
    return [ordered[round(i * (len(ordered) - 1) / max(1, n - 1))] for i in range(n)]


def calibrate(pairs: Sequence[tuple[tuple[int, ...], int]], n: int, timeout_s: float) -> tuple[Unloaded, int]:
    """``n`` requests spread over the prompt lengths, one at a time, on the running server, each tried
    ``CALIBRATION_TRIES`` times (a fresh lead id each time): its sample is the fastest try that streamed
    (``Outcome.streamed``; plain vLLM's server on two cores at times sends a whole answer at once). The fit,
    and how many requests never streamed (left out)."""
    samples, left_out = [], 0
    for i, (ids, out) in enumerate(spread(pairs, n)):
        tries = [
            send([Arrival(0.0, (3100 + (i * CALIBRATION_TRIES + k) % 900, *ids), out)], None, timeout_s)[0]
            for k in range(CALIBRATION_TRIES)
        ]
        good = [o for o in tries if o.streamed and o.ttft_s is not None]
        if not good:
            left_out += 1
            continue
        best = min(good, key=lambda o: o.ttft_s or 0.0)
        samples.append((len(ids) + 1, best.ttft_s or 0.0, best.tpot_s))
    return fit_unloaded(samples), left_out


def search_system(
    name: str, args: argparse.Namespace, pairs: Sequence[tuple[tuple[int, ...], int]], unloaded: Unloaded,
    data: dict[str, Any], began: float,
) -> None:  # fmt: skip
    """The goodput search of system ``name`` (its server running) at every scale, into ``data`` (saved after every
    point)."""
    memo: dict[float, tuple[list[Outcome], float]] = {}  # plain vLLM ignores the SLOs: a rate's run serves all scales
    points = itertools.count()
    for scale in args.scales:
        slos = [unloaded.slo_ms(len(ids) + 2, n, scale, args.multiple) for ids, n in pairs]
        saved = {p["rate"]: p for p in data["systems"].get(name, {}).get(f"{scale:g}", {}).get("points", [])}
        run: dict[str, Any] = {"points": []}
        data["systems"].setdefault(name, {})[f"{scale:g}"] = run

        def probe(
            rate: float,
            scale: float = scale,
            slos: list[dict[str, float]] = slos,
            run: dict[str, Any] = run,
            saved: dict[float, dict[str, Any]] = saved,
        ) -> float:
            if rate in saved:  # measured by the run this one resumes
                run["points"].append(saved[rate])
                return float(saved[rate]["attain_all"])
            if name == "vllm" and rate in memo:
                outcomes, preempted = memo[rate]
            else:
                before = preemptions()
                sent = arrivals(pairs, rate, args.seed, next(points))
                outcomes = send(sent, None if name == "vllm" else slos, args.timeout)
                preempted = preemptions() - before
                memo[rate] = outcomes, preempted
            summary = summarize(outcomes, slos) | {"rate": rate, "preemptions": preempted}
            run["points"].append(summary)
            write_result(Path(args.out), data, report, echo=False, plot=plot)
            print(
                f"{name} scale {scale:g} rate {rate:.2f}: all SLOs met {summary['attain_all']:.0%}; "
                f"{time.monotonic() - began:.0f} s",
                flush=True,
            )
            return summary["attain_all"]

        b = search(probe, args.start_rate, args.steps, args.target)
        run["bracket"] = {"met": b.met, "missed": b.missed}


SAME_RUN = ("requests", "seed", "multiple", "target", "max_prompt", "max_tokens", "start_rate", "steps", "calibration")


def resumed(args: argparse.Namespace, facts: dict[str, str]) -> tuple[dict[str, Any], str, bool]:
    """The result at ``--out`` to go on with (its workload's flags must be this run's), the cost profile its
    systems ran on (the scratch profile, when its fit is the one recorded; else measured again), and whether
    that has SCLS's section. The resuming run's facts are added under ``resumed``."""
    from paper_policies import PROFILE, cost_profile, profile_record

    data: dict[str, Any] = json.loads(Path(args.out).with_suffix(".json").read_text())
    differ = [k for k in SAME_RUN if data["args"].get(k) != getattr(args, k)]
    if differ:
        raise SystemExit(f"--resume: the saved run differs in {', '.join(differ)}")
    record = data.get("profile", {})
    if args.cost_profile is None and PROFILE.exists() and profile_record(args, str(PROFILE)) == record:
        profile = str(PROFILE.resolve())
    else:
        profile, _ = cost_profile(args)
    data["args"]["systems"] = list(dict.fromkeys([*data["args"]["systems"], *args.systems]))
    data["args"]["scales"] = list(dict.fromkeys([*data["args"]["scales"], *args.scales]))
    data.setdefault("resumed", []).append(facts)
    return data, profile, json.loads(Path(profile).read_text()).get("scls") is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=[s for s in SYSTEMS if s not in VARIANT_SYSTEMS])
    ap.add_argument("--scales", nargs="+", type=float, default=[0.5, 1.0, 2.0], help="SLO scales (DistServe)")
    ap.add_argument("--multiple", type=float, default=5.0, help="SLO at scale 1, as a multiple of unloaded latency")
    ap.add_argument("--requests", type=int, default=300, help="requests a point (the search's unit)")
    ap.add_argument("--start-rate", type=float, default=4.0, help="requests per second of the search's first point")
    ap.add_argument("--steps", type=int, default=2, help="bisections after the bracket is found")
    ap.add_argument("--target", type=float, default=0.9, help="share of requests meeting all their SLOs")
    ap.add_argument("--calibration", type=int, default=24, help="requests served alone to measure unloaded latency")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may take before it counts failed")
    ap.add_argument("--cost-profile", default=None, help="reuse this profile instead of running tetriserve profile")
    ap.add_argument("--profile-repeats", type=int, default=1, help="tetriserve profile --repeats")
    ap.add_argument("--out", default=str(RESULTS / "slo_goodput"), help="results stem (.md and .json)")
    ap.add_argument(
        "--resume", action="store_true", help="go on with the result at --out: keep its calibration and points"
    )
    ap.add_argument("--report-only", action="store_true", help="rewrite the report and plot from the saved JSON")
    args = ap.parse_args()
    if args.report_only:
        return write_result(
            Path(args.out), json.loads(Path(args.out).with_suffix(".json").read_text()), report, plot=plot
        )
    if args.requests < 300:
        ap.error("--requests: at least 300 requests a point (fewer make the 90% line noise)")
    from paper_policies import cost_profile, profile_record, sharegpt_pairs
    from vllm_bench_serve import prepare, serving

    facts = run_facts()
    model, _, env = prepare()
    pairs = sharegpt_pairs(args.requests, args.seed, model, args.max_prompt, args.max_tokens)
    if args.resume:
        data, profile, scls_profile = resumed(args, facts)
    else:
        profile, scls_profile = cost_profile(args)
        data = {**facts, "args": vars(args), "profile": profile_record(args, profile), "systems": {}}
    order = ["vllm", *[s for s in args.systems if s != "vllm"]]  # vLLM first: the calibration runs on it
    began = time.monotonic()
    for name in order:
        if name not in args.systems and "unloaded" in data:  # plain vLLM ran only to calibrate, which is done
            continue
        cmd, senv = server(name, model, env, profile, scls_profile)
        with serving(cmd, senv, WORK / f"slo_goodput_{name}.log", PORT):
            send(warmup_arrivals(pairs), None, args.timeout)  # a cold engine's first steps are not its speed
            if "unloaded" not in data:
                unloaded, left_out = calibrate(pairs, args.calibration, args.timeout)
                data["unloaded"], data["calibration_left_out"] = asdict(unloaded), left_out
            if name not in args.systems:
                continue
            search_system(name, args, pairs, Unloaded(**data["unloaded"]), data, began)
    return write_result(Path(args.out), data, report, plot=plot)


if __name__ == "__main__":
    sys.exit(main())
