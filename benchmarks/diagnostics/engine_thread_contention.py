"""Does a second Python thread in the engine's process slow its steps?

    python benchmarks/diagnostics/engine_thread_contention.py --batches 1 4 --work-us 0 50 150 300 --repeats 3

A worker steps its engine in one thread while the actor's event loop, in another thread of the same process,
takes every step's tokens and publishes them (``engine/loop.py``). In the service, at 2 req/s, a decode
engine's steps took longer than the same engine's offline. This isolates the process-sharing part: one offline
engine (tiny model, one OMP thread, ``torch.compile`` on, 400-token prompts, 256 sampled tokens each at
temperature 1) steps ``--batches`` requests at once; after every step it wakes an asyncio loop in a second thread
(``call_soon_threadsafe``, as the worker does) that runs ``--work-us`` microseconds of pure-Python work, the
stand-in for publishing that step's tokens. ``0``: the loop is woken and does nothing. Reported per step: the
engine thread's wall time and its own CPU time (``time.thread_time``), medians over the timed repeat's steps.
Each configuration runs in a process of its own, the configurations interleaved ``--repeats`` times (this
machine's speed drifts). Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``) (``--out``, default
``engine_thread_contention``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import RESULTS


def child(batch: int, work_us: float) -> None:
    """Runs in its own process: print ``RESULT`` and JSON [wall ms, CPU ms], medians per engine step."""
    from vllm import EngineArgs, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    args = EngineArgs(
        model=str(build_tiny_model(default_tiny_model_dir())), max_model_len=2048, block_size=32,
        max_num_seqs=128, max_num_batched_tokens=2048, enable_chunked_prefill=True, enforce_eager=False, seed=0,
        async_scheduling=False, kv_cache_memory_bytes=1 << 30, disable_log_stats=True,
    )  # fmt: skip
    engine = LLMEngine.from_engine_args(args)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def publish() -> None:  # the actor's share of a step: pure Python, holding the interpreter lock
        until = time.perf_counter() + work_us * 1e-6
        while time.perf_counter() < until:
            json.dumps({"request": "r", "tokens": [1, 2, 3], "index": 7})

    params = SamplingParams(max_tokens=256, ignore_eos=True, temperature=1.0, detokenize=False)
    rng = random.Random(0)

    def run(tag: str) -> list[float]:
        for i in range(batch):
            prompt = [rng.randrange(100, 1000) for _ in range(400)]
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
        walls, cpus = [], []
        while engine.has_unfinished_requests():
            t, c = time.perf_counter(), time.thread_time()
            engine.step()
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            loop.call_soon_threadsafe(publish)
        return [statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3]

    run("warm")
    print("RESULT " + json.dumps(run("timed")), flush=True)
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--work-us", type=float, nargs="+", default=[0, 50, 150, 300])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="engine_thread_contention", help="report name under benchmarks/_work/diagnostics")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), float(args.child[1]))
        return 0
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")  # fmt: skip
    runs: dict[str, list[list[float]]] = {}
    for rep in range(args.repeats):
        for batch in args.batches:
            for work in args.work_us:
                cmd = [sys.executable, __file__, "--child", str(batch), str(work)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600).stdout
                line = next(x for x in out.splitlines() if x.startswith("RESULT "))  # vLLM logs to stdout too
                runs.setdefault(f"{batch}/{work:g}", []).append(json.loads(line.removeprefix("RESULT ")))
                print(f"repeat {rep}, batch {batch}, {work:g} us: {runs[f'{batch}/{work:g}'][-1]}", flush=True)
    command = "python benchmarks/diagnostics/engine_thread_contention.py " + " ".join(sys.argv[1:])
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    lines = [
        "# An engine's steps beside a second Python thread in its process",
        "",
        f"Command: `{command}`  ",
        "One offline engine (tiny random-weight Llama, one OMP thread, torch.compile on, 400-token prompts, 256 "
        "sampled tokens each); after every step a second thread's event loop is woken and runs the given "
        "microseconds of pure-Python work. Per step, the engine thread's wall and own CPU time (ms): the median "
        f"over {args.repeats} interleaved runs (each a process of its own) of each run's median; every run's "
        "figures in the last column.",
        "",
        "| batch | Python work per step in the other thread | wall ms | engine thread's CPU ms | runs (wall / CPU) |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for key, values in runs.items():
        batch, work = key.split("/")
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        each = ", ".join(f"{w:.2f} / {c:.2f}" for w, c in values)
        lines.append(f"| {batch} | {work} µs | {wall:.2f} | {cpu:.2f} | {each} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
