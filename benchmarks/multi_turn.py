"""Multi-turn chat: ShareGPT conversations replayed turn by turn, prefix placement against least-load placement
and against plain vLLM.

A conversation is a ShareGPT record's human and gpt turns in order, each tokenized alone by the tiny model's
tokenizer (no special tokens; one BOS first). Turn k's prompt is every turn before it, the recorded gpt answers
standing in for the model's, then human turn k, as token ids, so that a turn's prompt extends the previous
turn's exactly; it asks for its recorded answer's length, capped at ``--max-tokens`` (ignore_eos, greedy). A
conversation sends turn k + 1 after turn k's last token and a think time (exponential, mean ``--think-s``);
conversations start at Poisson arrivals (``--rate`` a second); a conversation ends after ``--turns`` turns, or
before a prompt and its answer would pass ``MAX_MODEL_LEN``. The seed draws the conversations, the arrivals and
the think times, the same for every system.

Systems, each a fresh server after a warm-up of unrelated prompts (not measured):

    prefix      tetriserve serve, 2 prefill + 2 decode engines of one thread, prefill.placement prefix (default)
    least-load  the same with prefill.placement least-load
    vllm        plain vLLM, one engine of two threads (the same two cores), its prefix cache on (its default)

Per system: median TTFT per turn number; over the run (``/metrics`` before and after) the prompt tokens the
prefill-side engines computed and took from their prefix cache (this service: its prefill workers', and its
decode workers' for prompts computed there; plain vLLM: its prefix cache's queries and hits), the hit rate,
the KV bytes sent between workers, and prefix placement's own counts. Every prompt is sent whole: what a
system reuses, it finds in its own caches.

    python benchmarks/multi_turn.py --conversations 32 --turns 6 --seed 0

Writes ``benchmarks/results/multi_turn.{md,json,png}`` (``--out``); ``--report-only`` rewrites the report and
the plot from the saved JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import RESULTS, WORK, provenance, run_facts, write_result  # noqa: E402

PORT = 8100
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 2048
MARGIN = 16  # tokens a turn leaves free of the context
WARMUP = 8
SYSTEMS = ("prefix", "least-load", "vllm")


# -- the conversations (pure) ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    prompt: tuple[int, ...]  # the conversation so far, then this turn's human message
    max_tokens: int


@dataclass(frozen=True)
class Conversation:
    start_s: float  # when its first turn is sent, from the run's start
    turns: tuple[Turn, ...]
    think_s: tuple[float, ...]  # the pause after each turn's answer (the last one unused)


def exchanges(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A record's (human, gpt) exchanges in order, from its first human turn, while they alternate and are
    non-empty."""
    turns = [t for t in record.get("conversations") or [] if isinstance(t, dict)]
    start = next((i for i, t in enumerate(turns) if t.get("from") == "human"), None)
    out: list[tuple[str, str]] = []
    if start is None:
        return out
    for human, gpt in zip(turns[start::2], turns[start + 1 :: 2], strict=False):
        h, g = human.get("value"), gpt.get("value")
        if human.get("from") != "human" or gpt.get("from") != "gpt" or not isinstance(h, str) or not isinstance(g, str):
            break
        if not h.strip() or not g.strip():
            break
        out.append((h, g))
    return out


def build_turns(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], bos: Sequence[int], max_turns: int, max_tokens: int
) -> tuple[Turn, ...]:
    """The turns of one conversation of tokenized (human, gpt) exchanges: each prompt the one before, its answer
    and the next human message; at most ``max_turns``, stopping before one would pass the context."""
    out: list[Turn] = []
    history: tuple[int, ...] = tuple(bos)
    for human, gpt in pairs[:max_turns]:
        prompt = (*history, *human)
        n = min(len(gpt), max_tokens)
        if n < 1 or len(prompt) + n > MAX_MODEL_LEN - MARGIN:
            break
        out.append(Turn(prompt, n))
        history = (*prompt, *gpt)
    return tuple(out)


def draw(
    conversations: Sequence[tuple[Turn, ...]], n: int, rate: float, think_s: float, seed: int
) -> list[Conversation]:
    """``n`` conversations of at least two turns drawn by ``seed``, with Poisson starts at ``rate`` and
    exponential think times of mean ``think_s``."""
    rng = random.Random(f"multi-turn-{seed}")
    usable = [c for c in conversations if len(c) >= 2]
    if len(usable) < n:
        raise ValueError(f"{len(usable)} usable multi-turn conversations, {n} wanted")
    chosen = rng.sample(usable, n)
    out, t = [], 0.0
    for turns in chosen:
        t += rng.expovariate(rate)
        out.append(Conversation(t, turns, tuple(rng.expovariate(1 / think_s) for _ in turns)))
    return out


# -- what a run measured (pure) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnOutcome:
    conversation: int
    turn: int  # 1-based
    prompt_tokens: int
    tokens: int
    ttft_s: float | None
    error: str | None = None


def per_turn(outcomes: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Per turn number: turns sent, failed, and the median TTFT (ms) of those that had a first token."""
    out: dict[int, dict[str, float]] = {}
    for k in sorted({o["turn"] for o in outcomes}):
        these = [o for o in outcomes if o["turn"] == k]
        ttfts = [1e3 * o["ttft_s"] for o in these if o["ttft_s"] is not None]
        out[k] = {
            "sent": float(len(these)),
            "failed": float(sum(o["error"] is not None for o in these)),
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else math.nan,
        }
    return out


# the counters taken as they are: prefix placement's (this service), the prefix cache's in tokens (plain vLLM)
COUNTED = {
    "tetriserve": ("prefix_placements", "prefix_expected_hit_tokens"),
    "vllm": ("prefix_cache_queries", "prefix_cache_hits"),
}
_SAMPLE = re.compile(r"^(tetriserve|vllm):(\w+?)(?:_total)?(?:\{([^}]*)\})? (\S+)$")


def counters(text: str) -> dict[str, float]:
    """What the report reads of a ``/metrics`` text, summed over workers: prompt tokens computed and cached by
    the prefill-side engines, KV bytes sent, prefix placement's counts (this service), or the prefix cache's
    queries and hits (plain vLLM)."""
    out: dict[str, float] = {}

    def add(key: str, v: float) -> None:
        out[key] = out.get(key, 0.0) + v

    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        prefix, name, raw, value = m.group(1), m.group(2), m.group(3) or "", float(m.group(4))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', raw))
        if prefix == "tetriserve" and name == "engine_prompt_tokens" and labels.get("source") in ("computed", "cached"):
            add(f"prompt_{labels['source']}", value)
        elif prefix == "tetriserve" and name == "kv_transfer_bytes" and labels.get("direction") == "sent":
            add("kv_bytes_sent", value)
        elif name in COUNTED.get(prefix, ()):
            add(name, value)
    if "prefix_cache_queries" in out:  # plain vLLM counts tokens queried and found
        out["prompt_cached"] = out.get("prefix_cache_hits", 0.0)
        out["prompt_computed"] = out["prefix_cache_queries"] - out["prompt_cached"]
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def hit_rate(c: Mapping[str, float]) -> float:
    total = c.get("prompt_computed", 0.0) + c.get("prompt_cached", 0.0)
    return c.get("prompt_cached", 0.0) / total if total else math.nan


# -- the report ------------------------------------------------------------------------------------------------


def report(data: dict[str, Any]) -> str:
    a = data["args"]
    n = a.get("offload_max_tokens")
    offload = "" if n is None else f", prefill.offload_max_tokens {n}"
    lines = [
        "# Multi-turn chat: prefix placement against least load and against plain vLLM",
        "",
        *provenance(data),
        "",
        f"{a['conversations']} ShareGPT conversations of 2 to {a['turns']} turns (seed {a['seed']}), replayed turn "
        f"by turn: each turn's prompt is the conversation so far, sent {a['think_s']:g} s (mean, exponential) "
        f"after the previous answer; conversations start at {a['rate']:g} a second (Poisson); answers of the "
        f"recorded length capped at {a['max_tokens']}, ignore_eos. Ours: 2 prefill + 2 decode engines of one "
        f"thread{offload}; plain vLLM: one engine of two threads. Prompt tokens are the prefill-side engines' "
        "(ours: prefill workers and prompts computed on decode workers), cached ones from each engine's prefix "
        "cache.",
        "",
        "| system | turns | failed | TTFT p50 ms, turn 1 | TTFT p50 ms, turns 2+ | prompt tokens computed | cached "
        "| hit rate | KV MiB sent | prefix placements |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in data["systems"].items():
        outs = run["outcomes"]
        c = run["counters"]
        first = [1e3 * o["ttft_s"] for o in outs if o["turn"] == 1 and o["ttft_s"] is not None]
        later = [1e3 * o["ttft_s"] for o in outs if o["turn"] > 1 and o["ttft_s"] is not None]
        kv, moved = c.get("kv_bytes_sent"), c.get("prefix_placements")
        lines.append(
            f"| {name} | {len(outs)} | {sum(o['error'] is not None for o in outs)} | "
            f"{statistics.median(first) if first else math.nan:.0f} | "
            f"{statistics.median(later) if later else math.nan:.0f} | {c.get('prompt_computed', 0):.0f} | "
            f"{c.get('prompt_cached', 0):.0f} | {hit_rate(c):.0%} | "
            f"{'-' if kv is None else f'{kv / 2**20:.1f}'} | {'-' if moved is None else f'{moved:.0f}'} |"
        )
    lines += ["", f"![median TTFT per turn]({Path(a.get('out') or 'multi_turn').name}.png)", "", "## Per turn", ""]
    names = list(data["systems"])
    lines += ["| turn | " + " | ".join(f"{n}: sent / TTFT p50 ms" for n in names) + " |"]
    lines += ["|---|" + "---|" * len(names)]
    turns = sorted({k for run in data["systems"].values() for k in run["per_turn"]}, key=int)
    for k in turns:
        cells = []
        for n in names:
            t = data["systems"][n]["per_turn"].get(k)
            cells.append("-" if t is None else f"{t['sent']:.0f} / {t['ttft_p50_ms']:.0f}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    """The median TTFT per turn number, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, run in data["systems"].items():
        turns = sorted(run["per_turn"], key=int)
        ax.plot([int(k) for k in turns], [run["per_turn"][k]["ttft_p50_ms"] for k in turns], marker="o", label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT p50, ms")
    ax.set_title("Multi-turn chat: median time to first token per turn")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


# -- running it ------------------------------------------------------------------------------------------------


def conversations(model: str, max_turns: int, max_tokens: int, limit: int) -> list[tuple[Turn, ...]]:
    """Up to ``limit`` ShareGPT conversations of two turns or more, as turns (``build_turns``)."""
    from transformers import AutoTokenizer

    from tetriserve.common.sharegpt import iter_conversations

    tok = AutoTokenizer.from_pretrained(model)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    out: list[tuple[Turn, ...]] = []
    for rec in iter_conversations():
        pairs = exchanges(rec)[:max_turns]
        if len(pairs) < 2:
            continue
        enc = [(tok.encode(h, add_special_tokens=False), tok.encode(g, add_special_tokens=False)) for h, g in pairs]
        turns = build_turns(enc, bos, max_turns, max_tokens)
        if len(turns) >= 2:
            out.append(turns)
            if len(out) >= limit:
                break
    return out


async def _turn(client: Any, conv: int, k: int, turn: Turn) -> TurnOutcome:
    body = {
        "model": MODEL_NAME,
        "prompt": list(turn.prompt),
        "max_tokens": turn.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    sent, first, tokens = time.monotonic(), None, 0
    try:
        async with client.stream("POST", f"http://127.0.0.1:{PORT}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return TurnOutcome(conv, k, len(turn.prompt), 0, None, f"HTTP {r.status_code}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text"):
                    tokens += 1
                    first = first if first is not None else time.monotonic()
    except Exception as exc:
        return TurnOutcome(conv, k, len(turn.prompt), tokens, None, f"{type(exc).__name__}: {exc}")
    return TurnOutcome(conv, k, len(turn.prompt), tokens, None if first is None else first - sent)


def replay(convs: Sequence[Conversation], timeout_s: float = 600.0) -> list[TurnOutcome]:
    """Every conversation from its start, turn after turn with its think times; the outcomes of every turn."""
    import httpx

    async def one(client: Any, i: int, c: Conversation, start: float) -> list[TurnOutcome]:
        await asyncio.sleep(max(0.0, start + c.start_s - time.monotonic()))
        outs = []
        for k, (turn, think) in enumerate(zip(c.turns, c.think_s, strict=True), 1):
            outs.append(await _turn(client, i, k, turn))
            if outs[-1].error is not None:
                break  # a conversation whose turn failed goes no further
            await asyncio.sleep(think)
        return outs

    async def run() -> list[TurnOutcome]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30)) as client:
            start = time.monotonic()
            done = await asyncio.gather(*(one(client, i, c, start) for i, c in enumerate(convs)))
            return [o for outs in done for o in outs]

    return asyncio.run(run())


def server(
    name: str, model: str, env: dict[str, str], offload_max_tokens: int | None = None
) -> tuple[list[str], dict[str, str]]:
    from vllm_bench_serve import tetriserve_cmd, vllm_server

    if name == "vllm":
        return vllm_server(model, PORT, env, threads=2)
    engines = ["--threads-per-engine", "1", "--num-prefill", "2", "--num-decode", "2", "--max-model-len", "2048"]
    offload = [] if offload_max_tokens is None else ["--offload-max-tokens", str(offload_max_tokens)]
    return tetriserve_cmd(*engines, *offload, "--set", f"prefill.placement={name}"), env


def metrics_text() -> str:
    import httpx

    return httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=30).text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=6, help="most turns of a conversation")
    ap.add_argument("--rate", type=float, default=0.5, help="conversations started a second (Poisson)")
    ap.add_argument("--think-s", type=float, default=1.0, help="mean pause between an answer and the next turn")
    ap.add_argument("--max-tokens", type=int, default=128, help="cap on a turn's answer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--offload-max-tokens",
        type=int,
        default=None,
        help="our servers' prefill.offload_max_tokens (prompts this short are computed on a decode worker; "
        "default: the service's)",
    )
    ap.add_argument("--out", default=str(RESULTS / "multi_turn"), help="results stem (.md, .json and .png)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report and plot from the saved JSON")
    args = ap.parse_args()
    if args.report_only:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        return write_result(Path(args.out), saved, report, plot=plot)
    from vllm_bench_serve import prepare, serving

    facts = run_facts()
    model, _, env = prepare()
    convs = draw(
        conversations(model, args.turns, args.max_tokens, 20 * args.conversations),
        args.conversations,
        args.rate,
        args.think_s,
        args.seed,
    )
    warm = [Conversation(0.0, (Turn((1, 4000 + i, *range(200, 264)), 8),), (0.0,)) for i in range(WARMUP)]
    data: dict[str, Any] = {**facts, "args": vars(args), "systems": {}}
    for name in args.systems:
        cmd, senv = server(name, model, env, args.offload_max_tokens)
        began = time.monotonic()
        with serving(cmd, senv, WORK / f"multi_turn_{name}.log", PORT):
            replay(warm)
            before = counters(metrics_text())
            outcomes = [asdict(o) for o in replay(convs)]
            after = counters(metrics_text())
        run = {"outcomes": outcomes, "per_turn": per_turn(outcomes), "counters": delta(before, after)}
        data["systems"][name] = run
        print(
            f"{name}: {len(outcomes)} turns, hit rate {hit_rate(run['counters']):.0%}, "
            f"{time.monotonic() - began:.0f} s",
            flush=True,
        )
        write_result(Path(args.out), data, report, echo=False, plot=plot)
    return write_result(Path(args.out), data, report, plot=plot)


if __name__ == "__main__":
    sys.exit(main())
