"""Does vLLM's multiprocess executor with asynchronous scheduling step a CPU engine faster than ours?

    python benchmarks/diagnostics/engine_executor.py --batches 1 64 --tokens 256
    python benchmarks/diagnostics/engine_executor.py --executors uni --threads 1 2 --batches 4 16 64 128

Plain vLLM's server runs the model in a separate worker process and, with it, overlaps scheduling with the
forward pass (async scheduling); tetriserve's engines step in-process (``uni`` executor, no async scheduling).
This steps one offline engine of each kind on the tiny model, the same way: ``--batches`` requests at once,
64-token prompts, ``--tokens`` output tokens each (greedy, or sampled at ``--temperature``), ``--threads`` OMP
threads (default one, as each of the service's engines has; several values: each is a configuration of its own,
to see what a second core buys a step at each batch size), ``torch.compile`` on (the service's default),
``--repeats`` timed repeats (default 2) after a warm-up. Each configuration runs in its own process. Writes
``<--out>.{md,json}`` (in ``benchmarks/_work/diagnostics``) (default ``engine_executor``).

``--executors uni tetri`` asks what tetriserve's decode engine adds to vLLM's own in-process engine offline (its
scheduler subclass, KV connector, logits processor and CPU worker), apart from the service around it;
``--without PIECE ...`` adds that engine without each piece named, one configuration each.

``--executors uni thread`` asks whether an in-process engine gains from vLLM's async scheduling when its model
runs in a thread of its own (``ModelThreadExecutor``): the engine thread then schedules the next step and
processes the last one's output while the model computes, the overlap plain vLLM's server gets from its worker
process, without leaving the process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import RESULTS

CONFIGS = {
    "uni (tetriserve's engines)": "uni",
    "mp + async scheduling (plain vLLM's server)": "mp",
    "uni, tetriserve's decode engine (its scheduler, KV connector, logits processor, worker)": "tetri",
    "uni, the model in a thread of its own + async scheduling": "thread",
}
PIECES = {  # what ``--without`` can take from ``tetri``: the engine argument that carries it, and vLLM's own value
    "scheduler": ("scheduler_cls", None),
    "connector": ("kv_transfer_config", None),
    "logits_processor": ("logits_processors", None),
    "worker": ("worker_cls", "auto"),
}


def model_thread_executor() -> type:
    """vLLM's in-process executor, but a non-blocking call (async scheduling's) runs the model on a thread of its
    own and returns a future, so the engine thread goes on scheduling while the model computes."""
    import concurrent.futures

    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.outputs import AsyncModelRunnerOutput
    from vllm.v1.serial_utils import run_method

    class ModelThreadExecutor(UniProcExecutor):
        def _init_executor(self) -> None:
            super()._init_executor()
            self._model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")

        def collective_rpc(  # type: ignore[override]
            self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None,
            non_block: bool = False, single_value: bool = False,
        ) -> Any:  # fmt: skip
            if not non_block:
                return super().collective_rpc(method, timeout, args, kwargs, non_block, single_value)

            def call() -> Any:
                result = run_method(self.driver_worker, method, args, kwargs or {})
                if isinstance(result, AsyncModelRunnerOutput):
                    result = result.get_output()
                return result if single_value else [result]

            return self._model_thread.submit(call)  # execute_model and sample_tokens call this

    return ModelThreadExecutor


def engine_args(backend: str, model: str) -> Any:
    """``uni``/``mp``: vLLM's own engine with that executor; ``tetri``: a tetriserve worker's engine as its decode
    role runs it (``build_engine_args``: the decode scheduler, the KV connector, the prior-output logits
    processor, tetriserve's CPU worker), with the same sizes as the others; ``tetri-PIECE``: that engine without
    one of those (``PIECES``), vLLM's own in its place."""
    from vllm import EngineArgs

    if backend.startswith("tetri"):
        from tetriserve.common.config import EngineConfig
        from tetriserve.engine.settings import EngineRole, build_engine_args

        args = build_engine_args(
            EngineConfig(max_model_len=2048, block_size=32, kv_cache_gb=1.0, seed=0), model, EngineRole.DECODE,
            chunk_size=2048, endpoint="engine-executor", transport="tcp",
            scheduler_cls="tetriserve.decode_worker.vllm_scheduler.TetriDecodeScheduler",
        )  # fmt: skip
        args.max_num_seqs, args.max_num_active_seqs, args.disable_log_stats = 256, None, True
        if piece := backend.removeprefix("tetri").removeprefix("-"):
            setattr(args, *PIECES[piece])
        return args
    return EngineArgs(
        model=model, max_model_len=2048, block_size=32,
        max_num_seqs=256, max_num_batched_tokens=2048, enable_chunked_prefill=True, enforce_eager=False,
        seed=0, distributed_executor_backend=model_thread_executor() if backend == "thread" else backend,
        async_scheduling=backend in ("mp", "thread"),
        kv_cache_memory_bytes=1 << 30, disable_log_stats=True,
    )  # fmt: skip


def child(backend: str, batch: int, tokens: int, repeats: int, temperature: float) -> None:
    """Runs in its own process: print ``RESULT`` and a JSON list of ms per engine step, per timed repeat."""
    from vllm import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    engine = LLMEngine.from_engine_args(engine_args(backend, str(build_tiny_model(default_tiny_model_dir()))))
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=temperature, detokenize=False)
    rng = random.Random(0)

    def run(n: int, tag: str) -> float:
        for i in range(n):
            prompt = [rng.randrange(100, 1000) for _ in range(64)]
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
        t0, steps = time.perf_counter(), 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        return (time.perf_counter() - t0) * 1e3 / steps

    run(4, "warm")
    print("RESULT " + json.dumps([run(batch, f"r{r}") for r in range(repeats)]), flush=True)
    os._exit(0)  # the multiprocess executor's workers go with this process


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", default="engine_executor", help="report name (.md, .json) under benchmarks/_work")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per configuration")
    ap.add_argument("--executors", nargs="+", choices=sorted(CONFIGS.values()), default=["uni", "mp"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="OMP threads per engine (one run each)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument(
        "--without", nargs="+", choices=PIECES, default=[],
        help="also run tetri without each of these pieces (one configuration each)",
    )  # fmt: skip
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]), int(args.child[3]), float(args.child[4]))
        return 0
    results: dict[str, dict[str, list[float]]] = {}
    chosen = [(label, backend) for label, backend in CONFIGS.items() if backend in args.executors]
    label = "uni, tetriserve's decode engine without its "
    chosen += [(label + piece.replace("_", " "), f"tetri-{piece}") for piece in args.without]
    for (label, backend), threads in itertools.product(chosen, args.threads):
        name = label if args.threads == [1] else f"{label}, {threads} OMP thread{'s' if threads > 1 else ''}"
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=str(threads),
                   VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")  # fmt: skip
        for batch in args.batches:
            child_args = (backend, batch, args.tokens, args.repeats, args.temperature)
            cmd = [sys.executable, __file__, "--child", *map(str, child_args)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=900).stdout
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))  # vLLM logs to stdout too
            results.setdefault(name, {})[str(batch)] = json.loads(line.removeprefix("RESULT "))
            print(f"{name}, batch {batch}: {results[name][str(batch)]} ms/step", flush=True)
    command = "python benchmarks/diagnostics/engine_executor.py " + " ".join(sys.argv[1:])
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"command": command, "ms_per_step": results}, indent=1))
    if "tetri" in args.executors or args.without:
        title = "# One CPU engine, vLLM's own against tetriserve's decode engine, in-process"
    elif "thread" in args.executors:
        title = "# One CPU engine, in-process: the model on the engine thread, or on one of its own (async scheduling)"
    elif len(args.executors) > 1:
        title = "# One CPU engine, in-process vs vLLM's multiprocess executor with async scheduling"
    else:
        title = f"# One CPU engine's steps ({args.executors[0]} executor) by batch and OMP threads"
    lines = [
        title,
        "",
        f"Command: `{command}`  ",
        f"Tiny random-weight Llama, 64-token prompts, {args.tokens} output tokens each "
        f"({'greedy' if args.temperature == 0 else f'sampled at temperature {args.temperature:g}'}), "
        f"{' or '.join(map(str, args.threads))} OMP thread(s), "
        f"torch.compile on; ms per engine step, median of {args.repeats} timed repeats after a warm-up (each "
        "repeat's in the JSON); each configuration "
        "in its own process on this machine's 2 cores.",
        "",
        "| executor | " + " | ".join(f"batch {b}" for b in args.batches) + " |",
        "| --- |" + " ---: |" * len(args.batches),
    ]
    for name, by_batch in results.items():
        cells = [f"{statistics.median(by_batch[str(b)]):.3f}" for b in args.batches]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
