"""The cycle collector's pauses in every process of the service during a burst.

    python benchmarks/diagnostics/gc_pauses.py --num-prompts 200 --seed 0

Runs one fresh ``tetriserve serve`` (extra ``--flags``), warmed up as in ``vllm_bench_serve.py``, then vLLM's
benchmark client's saturation scenario (``--num-prompts`` ShareGPT prompts at once, ``--seed``,
``--ignore-eos``). Every Python process of the server (front door, Ray's actors, the length predictor) and the
client load a ``sitecustomize`` from a scratch directory put first on ``PYTHONPATH``: a ``gc.callbacks`` hook
that logs each collection of at least ``MIN_MS``. A full (oldest-generation) collection holds the interpreter
lock throughout, so every thread of its process stops for that long (``common/gc_heap.py``). Reports, per
process, the collections inside the client's run (its start is its end less its duration, ``START_SLACK_S``
before that counted too): how many full ones, the longest, and the seconds of all logged collections. Writes
``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import PORT, client_args
from vllm_bench_report import RESULTS, code_state, report_head, saved
from vllm_bench_serve import label_of, prepare, run_bench, session_processes, warmed_server

MIN_MS = 1.0
START_SLACK_S = 1.0
HOOK = """
import gc, os, time
_LOG, _MIN_S, _started = {log!r}, {min_s!r}, [0.0]
def _pause(phase, info):
    if phase == "start":
        _started[0] = time.monotonic()
        return
    took = time.monotonic() - _started[0]
    if took >= _MIN_S:
        with open(os.path.join(_LOG, f"gc_{{os.getpid()}}.txt"), "a") as f:
            f.write(f"{{_started[0]:.4f}} {{info['generation']}} {{took:.4f}}\\n")
gc.callbacks.append(_pause)
"""


def pauses(log: Path, since: float, until: float) -> dict[int, list[tuple[float, int, float]]]:
    """pid -> (seconds after ``since``, generation, seconds paused) of each logged collection in the window."""
    out: dict[int, list[tuple[float, int, float]]] = {}
    for path in log.glob("gc_*.txt"):
        pid = int(path.stem.split("_")[1])
        for line in path.read_text().splitlines():
            at, gen, took = line.split()
            if since - START_SLACK_S <= float(at) <= until:
                out.setdefault(pid, []).append((float(at) - since, int(gen), float(took)))
    return out


def summary(found: dict[int, list[tuple[float, int, float]]], labels: dict[int, str]) -> list[dict]:
    rows = []
    for pid, logged in found.items():
        full = [took for _, gen, took in logged if gen == 2]
        rows.append(
            {
                "process": labels.get(pid, "another (the benchmark client, or a process gone by the end)"),
                "full_collections": len(full),
                "longest_full_s": round(max(full, default=0.0), 3),
                "seconds_paused": round(sum(took for _, _, took in logged), 3),
                "full_at_s": [round(at, 2) for at, gen, _ in logged if gen == 2],
            }
        )
    return sorted(rows, key=lambda r: -r["seconds_paused"])


def write(result: dict, args: argparse.Namespace) -> None:
    c = result["client"]
    lines = [
        *report_head(args.out, "The cycle collector's pauses during a burst", "gc_pauses.py", result),
        f"tetriserve's defaults{' with ' + args.flags if args.flags else ''}, warmed up as in "
        f"`vllm_bench_serve.py`; vLLM's benchmark client sent {args.num_prompts} ShareGPT prompts at once (seed "
        f"{args.seed}, `--ignore-eos`): {c['completed']:.0f} completed, {c['output_throughput']:.0f} output "
        f"tokens/s, median TTFT {c['median_ttft_ms']:.0f} ms, in {c['duration']:.1f} s. Collections of at least "
        f"{MIN_MS:g} ms inside the run (from {START_SLACK_S:g} s before its start), per process; `full at`: "
        "seconds after the run's start.",
        "",
        "| process | full collections | longest full, s | seconds paused (all logged) | full at, s |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for r in result["processes"]:
        at = ", ".join(f"{t:g}" for t in r["full_at_s"])
        lines.append(
            f"| {r['process']} | {r['full_collections']} | {r['longest_full_s']:.3f} | {r['seconds_paused']:.3f} "
            f"| {at} |"
        )
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="the benchmark client's seed (prompt sample)")
    ap.add_argument("--flags", default="", help="extra `tetriserve serve` flags")
    ap.add_argument("--out", default="gc_pauses")
    args = ap.parse_args()
    args.request_rate, args.single_prompts = 2.0, 50  # client_args' other scenarios' sizes, unused here
    model, dataset, env = prepare()
    bench = client_args(args)
    with tempfile.TemporaryDirectory() as scratch:
        hook, log = Path(scratch, "hook"), Path(scratch, "log")
        hook.mkdir(), log.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK.format(log=str(log), min_s=MIN_MS / 1e3))
        env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p))
        with warmed_server("gc_pauses", args.flags, bench, model, dataset, env) as proc:
            client_env = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the client's own pauses too
            try:
                client = run_bench("gc_pauses", "saturation", PORT, bench, model, dataset)
            finally:
                os.environ.pop("PYTHONPATH") if client_env is None else os.environ.update(PYTHONPATH=client_env)
            ended = time.monotonic()
            labels = {int(p.name): label_of(p) or "?" for p, _ in session_processes(proc.pid)}
        duration = float(saved("gc_pauses", "saturation")["duration"])
        found = pauses(log, ended - duration, ended)
    client = {k: client.get(k) for k in ("completed", "output_throughput", "median_ttft_ms")}
    result = {
        "command": sys.argv[1:],
        "code": code_state(),
        "client": {**client, "duration": duration},
        "processes": summary(found, labels),
    }
    write(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
