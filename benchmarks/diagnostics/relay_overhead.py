"""How much does the cluster add to the engine's own time per output token?

Measures, in one run on this machine, median TPOT of 200-token greedy requests
(100-token prompts) at 1 and 16 concurrent streams:

- ``engine``: one colocated vLLM engine driven in-process (no Ray, no KV transfer);
- ``cluster``: the same requests through the disaggregated cluster
  (GlobalScheduler → prefill worker → KV transfer → decode worker → the stream back), read through
  ``RayBackend`` as the front door reads it.

    python benchmarks/diagnostics/relay_overhead.py [--enforce-eager]

Writes ``relay_overhead{_eager}.md`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS, ROOT, command_line

sys.path.insert(0, str(ROOT))
MAX_TOKENS = 200
CONCURRENCY = (1, 16)


def prompts(n: int, tag: str) -> dict[str, tuple[int, ...]]:
    return {f"{tag}-{i}-{time.monotonic_ns()}": tuple(range(10 + i, 110 + i)) for i in range(n)}


def engine_side(eager: bool) -> dict[int, float]:
    """Run in a child process: vLLM reads its environment at import."""
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.config import EngineConfig
    from tetriserve.common.request import SamplingSpec
    from tetriserve.engine.colocated import ColocatedEngine

    eng = ColocatedEngine(
        EngineConfig(kv_cache_gb=1, enforce_eager=eager), str(build_tiny_model(default_tiny_model_dir()))
    )
    sampling = SamplingSpec(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out: dict[int, float] = {}

    async def main() -> None:
        await eng.generate_many(prompts(2, "warm"), sampling)
        for conc in CONCURRENCY:
            t0 = time.monotonic()
            await eng.generate_many(prompts(conc, "e"), sampling)
            out[conc] = (time.monotonic() - t0) / MAX_TOKENS * 1000

    asyncio.run(main())
    return out


def cluster_side(eager: bool) -> dict[int, float]:
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.config import ClusterConfig
    from tetriserve.common.request import Request, SamplingSpec
    from tetriserve.control_plane.launcher import launch
    from tetriserve.frontdoor.ray_backend import RayBackend

    cfg = ClusterConfig.load(
        overrides={"engine.kv_cache_gb": 1, "engine.enforce_eager": eager, "namespace": "relay-bench"}
    )
    cluster = launch(cfg, str(build_tiny_model(default_tiny_model_dir())))
    backend = RayBackend(cluster, "tiny-llama")
    sampling = SamplingSpec(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def one(rid: str, ids: tuple[int, ...]) -> float:
        first = None
        async for chunk in backend.generate(Request(rid, ids, sampling)):
            if first is None and chunk.token_ids:
                first = time.monotonic()
        assert first is not None
        return (time.monotonic() - first) / (MAX_TOKENS - 1) * 1000

    async def main() -> dict[int, float]:
        await asyncio.gather(*(one(r, p) for r, p in prompts(2, "warm").items()))
        res = {}
        for conc in CONCURRENCY:
            tpots = await asyncio.gather(*(one(r, p) for r, p in prompts(conc, "c").items()))
            res[conc] = statistics.median(tpots)
        return res

    try:
        return asyncio.run(main())
    finally:
        cluster.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--engine-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine_only:
        print(json.dumps(engine_side(args.enforce_eager)))
        return 0
    from tetriserve.common.config import EngineConfig
    from tetriserve.engine.settings import engine_env

    env = dict(os.environ, **engine_env(EngineConfig()))
    cmd = [sys.executable, __file__, "--engine-only"] + (["--enforce-eager"] if args.enforce_eager else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    engine = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    cluster = cluster_side(args.enforce_eager)
    mode = "eager" if args.enforce_eager else "compiled"
    lines = [
        f"# Time per output token: engine alone vs through the cluster ({mode})",
        "",
        f"Command: `{command_line()}`  ",
        f"{os.cpu_count()} CPU cores; tiny Llama; 100-token prompts, {MAX_TOKENS} greedy output tokens. "
        "Engine: wall time / output tokens of one colocated engine (1 OMP thread). "
        "Cluster: median per-request TPOT (after the first token), 1 prefill + 1 decode worker.",
        "",
        "| concurrent streams | engine alone (ms/token) | cluster TPOT (ms) | cluster / engine |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for conc in CONCURRENCY:
        lines.append(f"| {conc} | {engine[conc]:.2f} | {cluster[conc]:.2f} | {cluster[conc] / engine[conc]:.2f} |")
    text = "\n".join(lines) + "\n"
    suffix = "_eager" if args.enforce_eager else ""
    (RESULTS / f"relay_overhead{suffix}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
