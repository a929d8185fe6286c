"""Length predictor cost: latency per request, and the main engine's prefill throughput beside it.

TetriInfer §5.2.2 / Fig. 17 runs the predictor in parallel with the main LLM on the same
accelerator and reports a ~10 % prefill throughput drop under stress. Here, in one process
(as inside a prefill worker, engine_env's 1 OMP thread):

- latency: ``TrainedPredictor.predict`` on ShareGPT test prompts, batch 1 and batched;
- throughput: a prefill-only vLLM engine (colocated engine, ``max_tokens=1``) prefilling
  the same prompts, (a) alone, (b) with one prediction per request run in a thread as the
  prefill worker does (parallel mode), (c) with the predictor predicting batches of 16
  back to back for the whole run (stress). A fresh first token per round defeats the
  prefix cache, so every round computes every prompt.

    python benchmarks/predictor_serving.py [--prompts 64] [--rounds 3]

Writes ``benchmarks/results/predictor_serving.{md,json}``. The measuring child process prints nothing until it
is done (its output is the result); the parent prints a line as it starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_results import RESULTS, provenance, run_facts  # noqa: E402

MAX_PROMPT = 1024


def load_prompts(n: int, tokenizer_dir: str) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    from tetriserve.length_predictor.commands import DataOptions, load_pairs

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    test = [p for p in load_pairs(DataOptions(tokenizer_dir), progress=False) if p.split == "test"][:n]
    return [tuple(tok.encode(p.prompt, add_special_tokens=True)[-MAX_PROMPT:]) for p in test]


def latency(predictor: object, prompts: list[tuple[int, ...]]) -> dict[str, float]:
    from tetriserve.common.length import PredictInput

    items = [PredictInput(len(p), 2048, p) for p in prompts]
    predictor.predict(items[:4])  # type: ignore[attr-defined]
    one = []
    for it in items:
        t0 = time.perf_counter()
        predictor.predict([it])  # type: ignore[attr-defined]
        one.append((time.perf_counter() - t0) * 1000)
    out = {
        "b1_p50": statistics.median(one),
        "b1_p90": sorted(one)[int(0.9 * len(one))],
        "b1_mean": statistics.mean(one),
    }
    for size in (8, 32):
        t0 = time.perf_counter()
        for s in range(0, len(items), size):
            predictor.predict(items[s : s + size])  # type: ignore[attr-defined]
        out[f"b{size}_per_req"] = (time.perf_counter() - t0) * 1000 / len(items)
    return out


def child(n_prompts: int, rounds: int) -> dict[str, object]:
    import torch

    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.config import EngineConfig
    from tetriserve.common.length import PredictInput
    from tetriserve.common.request import SamplingSpec
    from tetriserve.engine.colocated import ColocatedEngine
    from tetriserve.length_predictor.paths import default_artifact
    from tetriserve.length_predictor.served import TrainedPredictor

    model = str(build_tiny_model(default_tiny_model_dir()))
    prompts = load_prompts(n_prompts, model)
    predictor = TrainedPredictor(default_artifact(), model)
    predictor.load()
    result: dict[str, object] = {"threads": torch.get_num_threads(), "prompt_tokens": sum(map(len, prompts))}
    result["latency"] = latency(predictor, prompts)
    engine = ColocatedEngine(EngineConfig(kv_cache_gb=2), model)
    sampling = SamplingSpec(max_tokens=1, temperature=0.0)
    items = [PredictInput(len(p), 2048, p) for p in prompts]

    async def run(mode: str, tag: str) -> float:
        reqs = {f"{tag}-{i}": (7 + hash(tag) % 1000, *p) for i, p in enumerate(prompts)}  # fresh first token
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                predictor.predict(items[:16])

        stress = threading.Thread(target=hammer)
        t0 = time.perf_counter()
        if mode == "stress":
            stress.start()
        if mode == "parallel":

            async def one(rid: str, ids: tuple[int, ...], item: PredictInput) -> None:
                await asyncio.gather(asyncio.to_thread(predictor.predict, [item]), engine.generate(rid, ids, sampling))

            await asyncio.gather(*(one(r, ids, it) for (r, ids), it in zip(reqs.items(), items, strict=True)))
        else:
            await engine.generate_many(reqs, sampling)
        elapsed = time.perf_counter() - t0
        stop.set()
        if stress.is_alive():
            stress.join()
        return sum(len(p) for p in reqs.values()) / elapsed

    async def main() -> dict[str, list[float]]:
        await run("alone", "warm")
        tps: dict[str, list[float]] = {"alone": [], "parallel": [], "stress": []}
        for r in range(rounds):
            for mode in tps:
                tps[mode].append(await run(mode, f"{mode}-{r}-{time.monotonic_ns()}"))
        return tps

    result["tokens_per_s"] = asyncio.run(main())
    return result


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    lat = res["latency"]
    tps = {k: statistics.median(v) for k, v in res["tokens_per_s"].items()}  # type: ignore[union-attr]
    lines = [
        "# Length predictor: latency and the main engine's prefill throughput beside it",
        "",
        *provenance(res),
        f"One process with {res['threads']} torch/OMP thread(s) (a prefill worker's "
        f"engine_env). {args.prompts} ShareGPT test prompts (tiny-llama tokens, cut to {MAX_PROMPT}), "
        f"{res['prompt_tokens']} prompt tokens per round. Predictor: committed g200 heads on "
        "all-MiniLM-L6-v2 (256 tokens, the encoder's default dtype: bfloat16 where the CPU has it in hardware).",
        "",
        "## Predictor latency (alone)",
        "",
        "| batch | ms per request |",
        "| --- | ---: |",
        f"| 1 (p50 / p90 / mean) | {lat['b1_p50']:.1f} / {lat['b1_p90']:.1f} / {lat['b1_mean']:.1f} |",  # type: ignore[index]
        f"| 8 | {lat['b8_per_req']:.1f} |",  # type: ignore[index]
        f"| 32 | {lat['b32_per_req']:.1f} |",  # type: ignore[index]
        "",
        f"## Prefill-only engine throughput (median of {args.rounds} rounds)",
        "",
        "| setting | prompt tokens/s | vs alone |",
        "| --- | ---: | ---: |",
    ]
    names = {
        "alone": "engine alone",
        "parallel": "+ one prediction per request, in a thread (parallel mode)",
        "stress": "+ predictor predicting batches of 16 back to back (stress)",
    }
    for k, name in names.items():
        lines.append(f"| {name} | {tps[k]:.0f} | {tps[k] / tps['alone']:.2f} |")
    lines += ["", f"Raw rounds: `{json.dumps(res['tokens_per_s'])}`"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.prompts, args.rounds)))
        return 0
    from tetriserve.common.config import EngineConfig
    from tetriserve.engine.settings import engine_env

    facts = run_facts()
    print(f"measuring in a child process ({args.rounds} rounds of {args.prompts} prompts)", flush=True)
    env = dict(os.environ, **engine_env(EngineConfig()))
    cmd = [sys.executable, __file__, "--child", "--prompts", str(args.prompts), "--rounds", str(args.rounds)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        sys.stderr.write(out.stderr[-5000:])
        return out.returncode
    res = {**facts, "args": vars(args), **json.loads(out.stdout.strip().splitlines()[-1])}
    text = report(res, args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "predictor_serving.json").write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "predictor_serving.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
