"""The length predictor's encoder in float32 against bfloat16 on this CPU: time, and what the heads make of it.

    python benchmarks/diagnostics/predictor_dtype.py [--prompts 300] [--repeats 3]

The trained predictor's MiniLM encoder (``length_predictor/encoder.py``) runs beside the engines on the same cores;
``dtype="auto"`` picks bfloat16 where the CPU multiplies bfloat16 matrices in hardware. This embeds the first
human turn of ``--prompts`` ShareGPT conversations (``first_human_prompt``) one at a time, as the served predictor
does at low load, on one thread, as the predictor's process does; float32 and bfloat16 alternate, ``--repeats``
times each, and the figure is the median over repeats of ms per prompt. Then both sets of embeddings go through
the committed heads: the cosine between the two embeddings of a prompt, the share of prompts given the same
bucket, and the relative difference of the predicted length. Writes
``predictor_dtype.{md,json}`` (in ``benchmarks/_work/diagnostics``).
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
from bench_results import measure_or_reload

DTYPES = ("float32", "bfloat16")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from tetriserve.common.sharegpt import first_human_prompt, iter_conversations
    from tetriserve.engine.hardware import cpu_has_bf16
    from tetriserve.length_predictor.artifact import load
    from tetriserve.length_predictor.encoder import Encoder, features
    from tetriserve.length_predictor.heads import infer
    from tetriserve.length_predictor.paths import default_artifact

    torch.set_num_threads(1)
    texts: list[str] = []
    for record in iter_conversations():
        if isinstance(record, dict) and (prompt := first_human_prompt(record)) is not None:
            texts.append(prompt)
        if len(texts) >= args.prompts:
            break
    art = load(default_artifact())
    encoders = {dt: Encoder.load(art.encoder_dir, art.max_length, dtype=dt, device="cpu") for dt in DTYPES}
    ms: dict[str, list[float]] = {dt: [] for dt in DTYPES}
    emb: dict[str, Any] = {}
    for _ in range(args.repeats):
        for dt, enc in encoders.items():
            enc.embed_batch(texts[:1])  # warm
            started = time.perf_counter()
            emb[dt] = np.stack([enc.embed_batch([t])[0] for t in texts])
            ms[dt].append((time.perf_counter() - started) / len(texts) * 1e3)
    lens = [n - 2 for n in encoders["float32"].token_lengths(texts)]  # MiniLM tokens as the length feature's proxy
    outs = {dt: infer(art.heads, torch.as_tensor(features(emb[dt], lens))) for dt in DTYPES}
    a, b = emb["float32"], emb["bfloat16"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    la, lb = np.asarray(outs["float32"].length, dtype=float), np.asarray(outs["bfloat16"].length, dtype=float)
    return {
        "cpu_has_bf16": cpu_has_bf16(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "prompts": len(texts),
        "ms_per_prompt": ms,
        "cosine_min": float(cos.min()),
        "cosine_median": float(np.median(cos)),
        "same_bucket": float((np.asarray(outs["float32"].bucket) == np.asarray(outs["bfloat16"].bucket)).mean()),
        "length_rel_diff_median": float(np.median(np.abs(la - lb) / np.maximum(la, 1.0))),
        "length_rel_diff_p95": float(np.percentile(np.abs(la - lb) / np.maximum(la, 1.0), 95)),
    }


def report(d: dict[str, Any]) -> str:
    f32, b16 = (statistics.median(d["ms_per_prompt"][dt]) for dt in DTYPES)
    each = {dt: ", ".join(f"{x:.1f}" for x in d["ms_per_prompt"][dt]) for dt in DTYPES}
    return "\n".join(
        [
            "# The length predictor's encoder: float32 against bfloat16 on this CPU",
            "",
            f"Command: `{d['command'].strip()}`  ",
            f"{d['prompts']} ShareGPT prompts (first human turn), embedded one at a time on one thread, MiniLM cut to "
            f"its 256 tokens; torch's CPU capability {d['capability']}, bfloat16 matrix instructions "
            f"{'present' if d['cpu_has_bf16'] else 'absent'} (so `auto` picks "
            f"{'bfloat16' if d['cpu_has_bf16'] else 'float32'}).",
            "",
            "| dtype | ms per prompt (median; each repeat) |",
            "| --- | --- |",
            f"| float32 | {f32:.1f} ({each['float32']}) |",
            f"| bfloat16 | {b16:.1f} ({each['bfloat16']}) |",
            "",
            f"bfloat16 / float32 time: {b16 / f32:.2f}. The two embeddings of a prompt: cosine min "
            f"{d['cosine_min']:.5f}, median {d['cosine_median']:.5f}. Through the committed heads: the same bucket "
            f"for {d['same_bucket']:.1%} of prompts; predicted length differs by a median "
            f"{d['length_rel_diff_median']:.2%} (95th percentile {d['length_rel_diff_p95']:.2%}).",
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload("predictor_dtype", args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
