"""What the front door pays to detokenize a token: the Rust stream against the sliding window.

    python benchmarks/diagnostics/detokenizer_cost.py [--tokens 20000] [--repeats 5]

The front door detokenizes every token of every stream (``frontdoor/detokenizer.py``). This times both ways
on the served tiny model's tokenizer, one token per call as a decode step delivers them: ShareGPT answers
tokenized (the text the service streams) and uniformly random token ids (byte tokens that split characters,
special tokens). Each figure is the median over ``--repeats`` of microseconds per token, and the texts of both
ways are checked equal. Writes ``detokenizer_cost.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import command_line
from vllm_bench_report import RESULTS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.sharegpt import iter_conversations
    from tetriserve.frontdoor.detokenizer import IncrementalDetokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tiny_model(default_tiny_model_dir())))
    answers: list[int] = []
    for record in iter_conversations():  # the gpt turns: the text the service streams back
        for turn in record.get("conversations") or ():
            if isinstance(turn, dict) and turn.get("from") == "gpt" and isinstance(turn.get("value"), str):
                answers.extend(tok.encode(turn["value"], add_special_tokens=False))
        if len(answers) >= args.tokens:
            break
    rng = random.Random(0)
    inputs = {
        "ShareGPT answers": answers[: args.tokens],
        "random ids": [rng.randrange(len(tok)) for _ in range(args.tokens)],
    }
    prompt = tok.encode("A question about the weather, asked politely?")
    rows = []
    for name, ids in inputs.items():
        times: dict[str, list[float]] = {"window": [], "stream": []}
        texts = {}
        for _ in range(args.repeats):
            for way in times:
                detok = IncrementalDetokenizer(tok, prompt, stream=way == "stream")
                started = time.perf_counter()
                texts[way] = "".join(detok.add((t,)) for t in ids)
                times[way].append((time.perf_counter() - started) / len(ids) * 1e6)
        window, stream = statistics.median(times["window"]), statistics.median(times["stream"])
        rows.append(
            {
                "input": name,
                "tokens": len(ids),
                "window_us": window,
                "stream_us": stream,
                "same_text": texts["window"] == texts["stream"],
            }
        )
    lines = [
        "# Detokenizing one token in the front door: Rust stream against the sliding window",
        "",
        f"Command: `{command_line()}`  ",
        f"The served tiny model's tokenizer; one token per call; median of {args.repeats} repeats, microseconds "
        "per token; one process on this 2-core machine, nothing else running.",
        "",
        "| input | tokens | window µs/token | stream µs/token | window / stream | same text |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['input']} | {r['tokens']} | {r['window_us']:.2f} | {r['stream_us']:.2f} | "
            f"{r['window_us'] / r['stream_us']:.1f} | {'yes' if r['same_text'] else 'NO'} |"
        )
    (RESULTS / "detokenizer_cost.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "detokenizer_cost.json").write_text(json.dumps({"args": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    return 0 if all(r["same_text"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
