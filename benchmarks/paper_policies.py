"""Each paper's policy against the default configuration, on real engines, in both modes: AccelGen §6 (SLO
attainment, JCT), SOLA §6 (TTFT and TPOT SLO attainment), SCLS §5 (throughput, JCT), CacheOpt §5 (TBT SLO
attainment, preemption stalls).

    python benchmarks/paper_policies.py            # 2 modes x 5 configurations, about 20 min on 2 cores

For each mode (``colocated``: two engines that each prefill and decode; ``disaggregated``: one prefill and one
decode worker) and each configuration (``default``, or a paper's preset: ``accelgen``, ``sola``, ``scls``,
``cacheopt``), a cluster is launched in this process (``launcher.launch``), one workload is replayed through
``RayBackend``, the cluster is shut down, and the next starts. Every configuration gets the same requests:
ShareGPT first-turn prompts (seeded, ``common.sharegpt``), ``max_tokens`` the ShareGPT answer's length in the
tiny model's tokens capped at ``--max-tokens``, ``ignore_eos``, Poisson arrivals at ``--rate``, and per request a
TTFT and a TBT objective drawn from the SLO classes (``--slo-classes``; tight and loose), so the SLO-aware
policies have something to decide.

The policies read one cost profile: ``tetriserve profile`` runs once at the start (``--cost-profile`` reuses a
profile instead) and every configuration is given it (``prefill.cost_profile``; SCLS's
``decode.admission.cost_profile`` reads its ``scls`` section). A policy's decisions are counted by the workers
(``status``: ``decided.<policy>.<decision>``) and reported as the difference over the replay.

Per run: TTFT p50/p99, TBT (a request's mean gap between tokens) p50/p99, JCT mean/p50, SLO attainment (the
share of requests meeting their own TTFT, TBT, both), output tokens/s, preemptions and decision counts; a
stream that does not end with all its tokens is counted as incomplete (and misses its SLOs). With
``--rounds`` > 1 the configuration order rotates from round to round and the report gives medians. Writes
``benchmarks/results/paper_policies.{md,json}`` (``--out``); a line per run as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import RESULTS, WORK, provenance, run_cli, run_facts, shown, write_result  # noqa: E402

MODEL_NAME = "tiny-llama"
MODES = ("colocated", "disaggregated")
CONFIGS = ("default", "accelgen", "sola", "scls", "cacheopt")
NAMESPACE = "tetriserve-bench-paper-policies"
PROFILE = WORK / "paper_policies_profile.json"

# The cluster every configuration runs on: the tiny model, no torch.compile (a launch per run; what is timed is
# the replay), 0.006 GiB of KV per engine (3,072 tokens at the tiny model's 2 KiB a token in bfloat16, 1,536 in
# float32: what about fifteen of the workload's requests hold, so that at the default rate admission and
# preemption have KV to compete for), the baseline length predictor.
BASE_OVERRIDES: dict[str, Any] = {
    "engine.max_model_len": 1024,
    "engine.enforce_eager": True,
    "engine.kv_cache_gb": 0.006,
    "prefill.predictor": "baseline",
    "num_prefill": 1,
    "num_decode": 1,
    "grpc_port": 0,
    "http_port": 0,
    "namespace": NAMESPACE,
}


def policy_overrides(name: str, profile: str | None, scls_profile: bool) -> dict[str, Any]:
    """The paper's preset (``common/presets.py``: every policy the way the paper's evaluation sets it), or
    nothing for the default; SCLS is given the run's profile for its eq. 3/4 when the profile has that section."""
    if name == "default":
        return {}
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")
    if name == "scls" and profile and scls_profile:
        return {"preset": name, "decode.admission.policy": "scls", "decode.admission.cost_profile": profile}
    return {"preset": name}


def cluster_overrides(
    mode: str, name: str, profile: str | None, scls_profile: bool, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A configuration's cluster: the base, the mode, the profile, its preset, and ``extra`` (``--set``) over all
    of them (an explicit setting wins over a preset's)."""
    return {
        **BASE_OVERRIDES,
        "mode": mode,
        "prefill.cost_profile": profile,
        **policy_overrides(name, profile, scls_profile),
        **(extra or {}),
    }


# -- the workload (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SloClass:
    name: str
    ttft_ms: float
    tbt_ms: float


@dataclass(frozen=True)
class Arrival:
    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    offset_s: float  # sent this long after the replay starts
    slo: SloClass


DEFAULT_CLASSES = "tight:60:10,loose:500:50"


def parse_classes(text: str) -> tuple[SloClass, ...]:
    """``name:ttft_ms:tbt_ms`` items separated by commas, e.g. ``tight:250:30,loose:2500:150``."""
    out = []
    for item in text.split(","):
        name, ttft, tbt = item.strip().split(":")
        out.append(SloClass(name, float(ttft), float(tbt)))
    if not out:
        raise ValueError("at least one SLO class")
    return tuple(out)


def build_workload(
    pairs: Sequence[tuple[tuple[int, ...], int]], rate: float, seed: int, classes: Sequence[SloClass]
) -> list[Arrival]:
    """One arrival per (prompt, max_tokens) pair, in order: Poisson arrivals at ``rate`` per second (the first
    at 0, ``common/workload.poisson``), then an SLO class drawn uniformly per request, both from one
    ``random.Random(seed)``."""
    from tetriserve.common.workload import poisson

    rng = random.Random(seed)
    offsets = poisson(rate, len(pairs), rng)
    return [
        Arrival(f"pp-{i}", prompt, max_tokens, t, rng.choice(list(classes)))
        for i, ((prompt, max_tokens), t) in enumerate(zip(pairs, offsets, strict=True))
    ]


def sharegpt_pairs(
    n: int, seed: int, model_path: str, max_prompt: int, max_tokens: int, min_tokens: int = 4
) -> list[tuple[tuple[int, ...], int]]:
    """``n`` ShareGPT conversations drawn by ``seed`` from ``common/workload.sharegpt_pool`` (a pool of 20 times
    ``n``): each one's first human turn, its first ``max_prompt`` tokens in the tiny model's tokenizer, and the
    length of the gpt answer after it, capped at ``max_tokens``."""
    from transformers import AutoTokenizer

    from tetriserve.common.workload import sharegpt_pool

    tok = AutoTokenizer.from_pretrained(model_path)
    pool = sharegpt_pool(lambda text: len(tok.encode(text, add_special_tokens=False)), limit=20 * n)
    rng = random.Random(seed)
    out: list[tuple[tuple[int, ...], int]] = []
    for sample in rng.sample(pool, len(pool)):
        ids = tuple(tok.encode(sample.prompt)[:max_prompt])
        length = min(sample.output_tokens, max_tokens)
        if length >= min_tokens and len(ids) >= 2:
            out.append((ids, length))
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} usable ShareGPT conversations among {len(pool)}")


# -- per-request outcomes and their summary (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    rid: str
    slo: str
    ttft_slo_ms: float
    tbt_slo_ms: float
    wanted: int  # max_tokens
    tokens: int  # received
    ttft_s: float | None  # send -> first token; None when none came
    tbt_s: float | None  # mean gap between tokens (first -> last over tokens - 1); None under two tokens
    jct_s: float | None  # send -> last token
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.tokens == self.wanted

    @property
    def met_ttft(self) -> bool:
        return self.complete and self.ttft_s is not None and self.ttft_s * 1e3 <= self.ttft_slo_ms

    @property
    def met_tbt(self) -> bool:
        # one token has no gap: its TBT objective holds
        return self.complete and (self.tbt_s is None or self.tbt_s * 1e3 <= self.tbt_slo_ms)


OUTCOME_FIELDS = tuple(Outcome.__dataclass_fields__)


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks (numpy's default); nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(outcomes: Sequence[Outcome], wall_s: float) -> dict[str, float]:
    """A run's figures: latencies of the complete requests, attainment over all (an incomplete one misses),
    output tokens per second of wall time."""
    done = [o for o in outcomes if o.complete]
    ttft = [o.ttft_s for o in done if o.ttft_s is not None]
    tbt = [o.tbt_s for o in done if o.tbt_s is not None]
    jct = [o.jct_s for o in done if o.jct_s is not None]
    n = len(outcomes)
    return {
        "requests": float(n),
        "incomplete": float(n - len(done)),
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "tbt_p50_ms": percentile(tbt, 50) * 1e3,
        "tbt_p99_ms": percentile(tbt, 99) * 1e3,
        "jct_mean_s": statistics.mean(jct) if jct else float("nan"),
        "jct_p50_s": percentile(jct, 50),
        "attain_ttft": sum(o.met_ttft for o in outcomes) / n if n else float("nan"),
        "attain_tbt": sum(o.met_tbt for o in outcomes) / n if n else float("nan"),
        "attain_both": sum(o.met_ttft and o.met_tbt for o in outcomes) / n if n else float("nan"),
        "throughput_tok_s": sum(o.tokens for o in outcomes) / wall_s if wall_s > 0 else float("nan"),
        "wall_s": wall_s,
    }


def counter_diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What each counter added between two ``status`` reads (a counter absent before started at 0)."""
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def rotated(names: Sequence[str], round_no: int) -> list[str]:
    """``names`` rotated by ``round_no`` places: each round starts one configuration later."""
    k = round_no % len(names) if names else 0
    return [*names[k:], *names[:k]]


# -- one run on a real cluster ---------------------------------------------------------------------------------


def counters(cluster: Any) -> dict[str, int]:
    """Every worker's ``decided.*`` counts and preemptions from ``status``, summed over the workers."""
    from tetriserve.frontdoor.ray_admin import RayAdmin

    st = asyncio.run(RayAdmin(cluster, MODEL_NAME).status())
    out: dict[str, int] = {}
    for w in st.workers:
        for key, value in dict(w.policy).items():
            if key.startswith("decided.") or key in ("preemptions", "swapped", "recomputed"):
                try:
                    out[key] = out.get(key, 0) + int(value)
                except ValueError:
                    continue
    return out


def replay(cluster: Any, arrivals: Sequence[Arrival], tag: str, timeout_s: float) -> tuple[list[Outcome], float]:
    """Send every arrival at its offset through a ``RayBackend`` and read its stream to the end; the outcomes
    and the wall time from the first send to the last stream's end."""
    from tetriserve.common.request import SLO, Request, SamplingSpec
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, MODEL_NAME)

    async def one(a: Arrival, start: float) -> tuple[Outcome, float]:
        await asyncio.sleep(max(0.0, start + a.offset_s - time.monotonic()))
        sampling = SamplingSpec(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
        request = Request(f"{a.rid}-{tag}", a.prompt, sampling, slo=SLO(ttft_ms=a.slo.ttft_ms, tbt_ms=a.slo.tbt_ms))
        sent = time.monotonic()
        first = last = None
        tokens, error = 0, None
        try:
            async for chunk in backend.generate(request):
                if chunk.token_ids:
                    now = time.monotonic()
                    first = first if first is not None else now
                    last = now
                    tokens += len(chunk.token_ids)
                if chunk.finish_reason is not None and chunk.finish_reason not in ("length", "stop"):
                    error = error or chunk.error or str(chunk.finish_reason)
        except Exception as exc:  # an overloaded or failed request counts as incomplete
            error = f"{type(exc).__name__}: {exc}"
        tbt = (last - first) / (tokens - 1) if first is not None and last is not None and tokens > 1 else None
        out = Outcome(
            a.rid,
            a.slo.name,
            a.slo.ttft_ms,
            a.slo.tbt_ms,
            a.max_tokens,
            tokens,
            first - sent if first is not None else None,
            tbt,
            last - sent if last is not None else None,
            error,
        )
        return out, last if last is not None else time.monotonic()

    async def run_all() -> tuple[list[Outcome], float]:
        start = time.monotonic()
        try:
            tasks = [asyncio.ensure_future(one(a, start)) for a in arrivals]
            done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()
            results = []
            for a, t in zip(arrivals, tasks, strict=True):
                if t in done and t.exception() is None:
                    results.append(t.result())
                else:
                    results.append(
                        (
                            Outcome(
                                a.rid,
                                a.slo.name,
                                a.slo.ttft_ms,
                                a.slo.tbt_ms,
                                a.max_tokens,
                                0,
                                None,
                                None,
                                None,
                                "timed out",
                            ),
                            start,
                        )
                    )
        finally:
            backend.close()
        end = max(t for _, t in results)
        return [o for o, _ in results], end - start

    return asyncio.run(run_all())


def warm_up(cluster: Any, arrivals: Sequence[Arrival]) -> None:
    """A few short requests at once, so that the replay does not pay the engines' first steps."""
    warm = [Arrival(f"warm-{i}", a.prompt, 4, 0.0, SloClass("warm", 1e6, 1e6)) for i, a in enumerate(arrivals[:4])]
    replay(cluster, warm, "warm", 120)


def run_one(
    mode: str,
    name: str,
    arrivals: Sequence[Arrival],
    model_path: str,
    profile: str | None,
    scls_profile: bool,
    tag: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    from tetriserve.common.config import ClusterConfig
    from tetriserve.control_plane.launcher import launch

    t0 = time.monotonic()
    cluster = launch(
        ClusterConfig.load(overrides=cluster_overrides(mode, name, profile, scls_profile, extra)), model_path
    )
    try:
        launch_s = time.monotonic() - t0
        warm_up(cluster, arrivals)
        before = counters(cluster)
        horizon = arrivals[-1].offset_s if arrivals else 0.0
        outcomes, wall = replay(cluster, arrivals, tag, horizon + 300)
        after = counters(cluster)
    finally:
        cluster.shutdown()
    diff = counter_diff(before, after)
    figures = summarize(outcomes, wall)
    return {
        "mode": mode,
        "config": name,
        "launch_s": launch_s,
        "elapsed_s": time.monotonic() - t0,
        **figures,
        "preemptions": diff.pop("preemptions", 0),
        "swapped": diff.pop("swapped", 0),
        "recomputed": diff.pop("recomputed", 0),
        "decided": {k.removeprefix("decided."): v for k, v in diff.items() if k.startswith("decided.")},
        "errors": sorted({o.error for o in outcomes if o.error})[:5],
        "outcome_fields": list(OUTCOME_FIELDS),
        "outcomes": [[getattr(o, f) for f in OUTCOME_FIELDS] for o in outcomes],
    }


# -- the report ------------------------------------------------------------------------------------------------

# what each paper says its policy moves, and where: (figure key, better when "up" or "down", label)
CLAIMS: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "accelgen": ("§6", (("attain_both", "up", "SLO attainment"), ("jct_mean_s", "down", "mean JCT"))),
    "sola": (
        "§6",
        (("attain_ttft", "up", "TTFT SLO attainment"), ("attain_tbt", "up", "TPOT SLO attainment")),
    ),
    "scls": ("§5", (("throughput_tok_s", "up", "throughput"), ("jct_mean_s", "down", "mean JCT"))),
    "cacheopt": ("§5", (("attain_tbt", "up", "TBT SLO attainment"), ("preemptions", "down", "preemptions"))),
}
PAPER = {"accelgen": "AccelGen", "sola": "SOLA", "scls": "SCLS", "cacheopt": "CacheOpt"}
NUMERIC = (
    "requests",
    "incomplete",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tbt_p50_ms",
    "tbt_p99_ms",
    "jct_mean_s",
    "jct_p50_s",
    "attain_ttft",
    "attain_tbt",
    "attain_both",
    "throughput_tok_s",
    "wall_s",
    "preemptions",
    "launch_s",
)


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's runs (one per round): the median of each figure, decision counts summed."""
    out: dict[str, Any] = {k: statistics.median(float(r[k]) for r in runs) for k in NUMERIC}
    decided: dict[str, int] = {}
    for r in runs:
        for k, v in r["decided"].items():
            decided[k] = decided.get(k, 0) + v
    out["decided"] = decided
    out["rounds"] = len(runs)
    return out


def by_class(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per SLO class, over every round's requests pooled: the share meeting its TTFT and its TBT objective, and
    the mean JCT of its complete requests (a policy that favours one class over the other shows here)."""
    outcomes = [Outcome(*row) for r in runs for row in r["outcomes"]]
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(o.slo for o in outcomes):
        mine = [o for o in outcomes if o.slo == name]
        jct = [o.jct_s for o in mine if o.complete and o.jct_s is not None]
        out[name] = {
            "requests": float(len(mine)),
            "attain_ttft": sum(o.met_ttft for o in mine) / len(mine),
            "attain_tbt": sum(o.met_tbt for o in mine) / len(mine),
            "jct_mean_s": statistics.mean(jct) if jct else float("nan"),
        }
    return out


def class_table(runs: Mapping[str, Sequence[dict[str, Any]]]) -> list[str]:
    """The report's per-class table of one mode: a row per configuration, TTFT met, TBT met and mean JCT per
    class."""
    classes = {name: by_class(rs) for name, rs in runs.items() if rs}
    names = list(dict.fromkeys(c for per in classes.values() for c in per))
    head = [f"{c} {label}" for c in names for label in ("TTFT met", "TBT met", "JCT mean s")]
    lines = ["", "By SLO class, every round's requests pooled:", "", "| configuration | " + " | ".join(head) + " |"]
    lines.append("|---|" + "---|" * len(head))
    for name, per in classes.items():
        cells = [
            fmt(per[c][k], k) if c in per else "-" for c in names for k in ("attain_ttft", "attain_tbt", "jct_mean_s")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


NOISE = 0.05  # a ratio this close to 1 is not read as a move


def verdict(paper: str, row: dict[str, Any], base: dict[str, Any]) -> str:
    """``<paper> predicts <metric> moves <way> (<section>): measured <ratio vs default>``, one clause per metric,
    each followed by whether it moved the predicted way. A change within ``NOISE`` of the default's value is
    called no clear move: one round on this machine moves a figure by that much on its own."""
    section, claims = CLAIMS[paper]
    parts = []
    for key, way, label in claims:
        v, b = float(row[key]), float(base[key])
        ratio = f"{v / b:.2f}x ({v:.3g} vs {b:.3g})" if b else "n/a (default 0)" if v == 0 else f"{v:g} vs 0"
        moved = (v > b) if way == "up" else (v < b)
        if v == b:
            word = "unchanged"
        elif b and abs(v / b - 1) <= NOISE:
            word = f"within {NOISE:.0%} of the default: no clear move"
        else:
            word = "moved as predicted" if moved else "moved the other way"
        parts.append(f"{label} moves {way} ({section}): measured {ratio}, {word}")
    return f"- {PAPER[paper]} predicts " + "; ".join(parts)


def fmt(v: Any, key: str) -> str:
    if key.startswith("attain"):
        return f"{100 * float(v):.0f}%"
    if key in ("preemptions", "incomplete", "requests"):
        return f"{float(v):g}"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def report(data: dict[str, Any]) -> str:
    a = data["args"]
    cols = [
        ("ttft_p50_ms", "TTFT p50 ms"),
        ("ttft_p99_ms", "TTFT p99 ms"),
        ("tbt_p50_ms", "TBT p50 ms"),
        ("tbt_p99_ms", "TBT p99 ms"),
        ("jct_mean_s", "JCT mean s"),
        ("jct_p50_s", "JCT p50 s"),
        ("attain_ttft", "TTFT met"),
        ("attain_tbt", "TBT met"),
        ("attain_both", "both met"),
        ("throughput_tok_s", "out tok/s"),
        ("preemptions", "preemptions"),
        ("incomplete", "incomplete"),
    ]
    w = data["workload"]
    lines = [
        "# Each paper's policy against the default, on real engines, in both modes",
        "",
        *provenance(data),
        "",
        f"{w['requests']} ShareGPT first-turn prompts (seed {a['seed']}; prompt {w['prompt_min']}-{w['prompt_max']} "
        f"tokens, mean {w['prompt_mean']:.0f}, cut at {a['max_prompt']}), max_tokens the answer's length capped at "
        f"{a['max_tokens']} (mean {w['output_mean']:.0f}), ignore_eos, greedy; Poisson arrivals at {a['rate']} req/s "
        f"over {w['span_s']:.0f} s; SLO classes drawn per request: "
        + ", ".join(
            f"{c['name']} (TTFT {c['ttft_ms']:g} ms, TBT {c['tbt_ms']:g} ms, {c['share']} requests)"
            for c in w["classes"]
        )
        + ". Tiny model, enforce_eager, "
        f"{BASE_OVERRIDES['engine.kv_cache_gb']} GiB of KV per engine, baseline length predictor; cost profile "
        f"{profile_text(data['profile'])}"
        f"{'' if data['scls_profile'] else ' (no scls section: SCLS uses its built-in values)'}."
        + (f" Set over every configuration: {', '.join(f'`{x}`' for x in a['set'])}." if a.get("set") else "")
        + f" Each run: a fresh cluster, 4 warm-up requests, the replay. {a['rounds']} round(s)"
        + (", configuration order rotated; figures are medians over rounds." if a["rounds"] > 1 else ".")
        + " TBT is a request's mean gap between tokens; attainment is the share of all requests (an incomplete "
        "one misses) that meet their own objective.",
    ]
    for mode in data["modes"]:
        rows = data["summary"].get(mode, {})
        if not rows:
            continue
        lines += [
            "",
            f"## {mode}",
            "",
            "| configuration | " + " | ".join(c[1] for c in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for name, row in rows.items():
            lines.append(f"| {name} | " + " | ".join(fmt(row[k], k) for k, _ in cols) + " |")
        lines += class_table(data["runs"][mode])
        lines += ["", "Decisions counted over the replay (`decided.<policy>.<decision>`, summed over workers):", ""]
        for name, row in rows.items():
            dec = ", ".join(f"{k} {v}" for k, v in row["decided"].items()) or "none"
            lines.append(f"- {name}: {dec}")
        if "default" in rows:
            lines += ["", "Against the default, same workload, same run:", ""]
            lines += [verdict(p, rows[p], rows["default"]) for p in CLAIMS if p in rows]
        bad = [f"{name} {int(row['incomplete'])}" for name, row in rows.items() if row["incomplete"]]
        lines += ["", f"Streams that did not end with all their tokens: {', '.join(bad) if bad else 'none'}."]
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------------------------


def profile_text(record: dict[str, Any]) -> str:
    """A profile record as the report's sentence shows it."""
    where = f"`{record['given']}`" if "given" in record else f"measured at the start of the run (`{record['command']}`)"
    return where + (f", pivot {record['pivot_tokens']} tokens" if "pivot_tokens" in record else "")


def cost_profile(args: argparse.Namespace) -> tuple[str, bool]:
    """The profile every configuration reads (``--cost-profile``, else one ``tetriserve profile`` run now, into the
    scratch folder), and whether it has the ``scls`` section."""
    path = Path(args.cost_profile) if args.cost_profile else PROFILE
    if not args.cost_profile:
        WORK.mkdir(parents=True, exist_ok=True)
        if run_cli(profile_command(args, shown(path)), {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}) != 0:
            raise SystemExit("tetriserve profile failed")
    return str(path.resolve()), json.loads(path.read_text()).get("scls") is not None


def profile_command(args: argparse.Namespace, out: str) -> list[str]:
    return ["profile", "--out", out, "--threads", "1", "--repeats", str(args.profile_repeats)]


def profile_record(args: argparse.Namespace, profile: str) -> dict[str, Any]:
    """What a result says of the profile it ran on: where it came from and its fit. A profile this run measured
    lives in the scratch folder, which a result must not name (a clean checkout has no such file), so the record
    holds the command and the fitted coefficients instead."""
    fit = json.loads(Path(profile).read_text())
    origin = (
        {"given": shown(Path(profile))}
        if args.cost_profile
        else {"command": " ".join(["tetriserve", *profile_command(args, "<scratch>")])}
    )
    return {
        **origin,
        **{k: fit[k] for k in ("prefill", "decode", "pivot_tokens", "pivot_seconds", "scls") if k in fit},
        "scls_section": fit.get("scls") is not None,
    }


def add_workload_args(ap: argparse.ArgumentParser, out_stem: str) -> None:
    """The workload's and the profile's flags, shared with the benchmarks that replay this workload
    (``predictor_queue_wait.py``); the request count and rate are each benchmark's own."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt", type=int, default=512, help="prompt tokens kept")
    ap.add_argument("--max-tokens", type=int, default=128, help="cap on a request's output tokens")
    ap.add_argument("--slo-classes", default=DEFAULT_CLASSES, help="name:ttft_ms:tbt_ms,... drawn per request")
    ap.add_argument("--cost-profile", default=None, help="reuse this profile instead of running tetriserve profile")
    ap.add_argument("--profile-repeats", type=int, default=1, help="tetriserve profile --repeats")
    ap.add_argument("--out", default=str(RESULTS / out_stem), help="results stem (.md and .json)")


def prepare(args: argparse.Namespace) -> tuple[str, str, bool, list[Arrival]]:
    """What a replaying benchmark starts from: the tiny model's path, the cost profile (and whether it has the
    ``scls`` section), and the workload the flags describe."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    model_path = str(build_tiny_model(default_tiny_model_dir()))
    profile, scls_profile = cost_profile(args)
    pairs = sharegpt_pairs(args.num_prompts, args.seed, model_path, args.max_prompt, args.max_tokens)
    return (
        model_path,
        profile,
        scls_profile,
        build_workload(pairs, args.rate, args.seed, parse_classes(args.slo_classes)),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--num-prompts", type=int, default=750)
    ap.add_argument(
        "--rate",
        type=float,
        default=10.0,
        help="Poisson arrivals per second (probed on the 2-core machine with the default configuration: at 5 "
        "every request met the tight SLOs and a TBT stayed about one decode step; at 12 the TBT median doubled "
        "and every request was still served; 10 loads it without overloading it)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="with more than 1, the configuration order rotates")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key set over every configuration, its preset's included (repeatable; an ablation, e.g. "
        "--set decode.preemption.order=vllm)",
    )
    add_workload_args(ap, "paper_policies")
    args = ap.parse_args()
    from tetriserve.cli.config_flags import parse_set

    try:
        extra = dict(parse_set(item) for item in args.set)
    except ValueError as exc:
        ap.error(str(exc))
    facts = run_facts()
    model_path, profile, scls_profile, arrivals = prepare(args)
    classes = parse_classes(args.slo_classes)
    plens, outs = [len(a.prompt) for a in arrivals], [a.max_tokens for a in arrivals]
    workload = {
        "requests": len(arrivals),
        "prompt_min": min(plens),
        "prompt_max": max(plens),
        "prompt_mean": statistics.mean(plens),
        "output_mean": statistics.mean(outs),
        "span_s": arrivals[-1].offset_s,
        "classes": [{**asdict(c), "share": sum(a.slo == c for a in arrivals)} for c in classes],
    }
    print(
        f"{len(arrivals)} requests over {workload['span_s']:.0f} s, mean output {workload['output_mean']:.0f}; "
        f"profile {profile}",
        flush=True,
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {c: [] for c in args.configs} for m in args.modes}
    total, k, began = args.rounds * len(args.modes) * len(args.configs), 0, time.monotonic()
    for r in range(args.rounds):
        for mode in args.modes:
            for name in rotated(args.configs, r):
                k += 1
                res = run_one(mode, name, arrivals, model_path, profile, scls_profile, f"r{r}-{mode}-{name}", extra)
                runs[mode][name].append(res)
                print(
                    f"[{k}/{total}] round {r} {mode:13s} {name:9s} {res['elapsed_s']:5.0f} s "
                    f"(launch {res['launch_s']:.0f} s): TTFT p50 {res['ttft_p50_ms']:.0f} ms, TBT p50 "
                    f"{res['tbt_p50_ms']:.1f} ms, both met {100 * res['attain_both']:.0f}%, "
                    f"{res['throughput_tok_s']:.0f} tok/s, {res['preemptions']} preemptions, "
                    f"{int(res['incomplete'])} incomplete; total {time.monotonic() - began:.0f} s",
                    flush=True,
                )
    summary = {m: {c: medians(rs) for c, rs in by.items() if rs} for m, by in runs.items()}
    data = {
        **facts,
        "args": vars(args),
        "modes": args.modes,
        "profile": profile_record(args, profile),
        "scls_profile": scls_profile,
        "workload": workload,
        "summary": summary,
        "runs": runs,
    }
    return write_result(Path(args.out), data, report)


if __name__ == "__main__":
    raise SystemExit(main())
