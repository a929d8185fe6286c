"""Where a served engine thread's time goes, part by part, sampled with py-spy.

    python benchmarks/diagnostics/engine_profile.py --scenario saturation --out engine_profile_saturation

Starts ``tetriserve serve`` (its defaults, with any ``--flags``) with the benchmark ports and KV size of
``vllm_bench_serve.py``, warms it up the same way, then runs one scenario of vLLM's benchmark client (``rate``,
``single`` or ``saturation``, with ``--ignore-eos``). ``--delay-s`` into the scenario (past the client's own
start-up) py-spy samples the process of the ``--engine`` thread (default ``eng-decode-0``) twice, one after the
other: for ``--seconds`` only while a thread holds the interpreter lock (``--gil``: the Python work that the
process's other threads wait for), then for ``--seconds`` by the wall clock (all of the thread's time, in native
code too). Each sample of the engine thread is put in the first part of ``PARTS`` whose frame is on its stack.
Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import CLIENT, PORT, URL, client_args
from thread_timeline import engine_threads, threads
from vllm_bench_report import RESULTS, ROOT, WORK
from vllm_bench_serve import prepare, run_bench, stop, tetriserve_cmd, wait_ready

PARTS = (  # (part, a frame's text that puts a sample in it), first match wins: innermost parts first
    ("model forward (vLLM's model runner)", "execute_model ("),
    ("sampling (vLLM)", "sample_tokens ("),
    ("scheduling (vLLM's scheduler and tetriserve's subclass)", ".schedule ("),
    ("updating requests from the step's output (vLLM's scheduler)", "update_from_output (vllm/v1/core"),
    ("building request outputs and their stats (vLLM's OutputProcessor)", "process_outputs ("),
    ("the engine's snapshot (tetriserve)", "EngineLoop._publish ("),
    ("deltas from outputs (tetriserve)", "EngineLoop._delta ("),
    ("handing deltas to the event loop (tetriserve)", "EngineLoop._emit ("),
    ("commands from the worker (tetriserve)", "EngineLoop._drain ("),
    ("the core board (tetriserve)", "CoreShare."),
)
OTHER = "other"


def parts_of(raw: str, thread: str) -> tuple[int, dict[str, int]]:
    """(samples of the engine thread, samples per part) in py-spy's ``raw`` output, whose lines are
    ``thread (tid): name;frame;frame... count``; the engine thread is the Python thread named ``engine-<worker>``
    (its OS name is ``eng-<worker>``)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        head = stack.split(";", 1)[0]
        if not n.isdigit() or f"engine-{thread.removeprefix('eng-')}" not in head:
            continue
        total += int(n)
        counts[next((part for part, frame in PARTS if frame in stack), OTHER)] += int(n)
    return total, dict(counts)


def spy(pid: int, seconds: float, gil: bool) -> str:
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-d", str(int(seconds))]
        cmd += ["-r", "200", "-f", "raw", "-o", out.name, "--threads", "--nonblocking"] + (["--gil"] if gil else [])
        subprocess.run(cmd, check=True, capture_output=True, timeout=seconds + 60)
        return Path(out.name).read_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("rate", "single", "saturation"), default="saturation")
    ap.add_argument("--engine", default="eng-decode-0", help="the OS name of the engine thread to sample")
    ap.add_argument("--flags", default="", help="extra `tetriserve serve` flags")
    ap.add_argument("--delay-s", type=float, default=12.0, help="seconds from the client's start to sampling")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of each of the two samplings")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--single-prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="the benchmark client's seed (prompt sample, arrivals)")
    ap.add_argument("--out", default="engine_profile")
    args = ap.parse_args()
    model, dataset, env = prepare()
    bench = client_args(args)
    raws: dict[str, str] = {}
    with open(WORK / "server_profile.log", "w") as log:
        cmd = tetriserve_cmd(*shlex.split(args.flags))
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(URL, proc)
            run_bench("profile", "warmup", PORT, bench, model, dataset)  # not measured
            found = threads(proc.pid)
            tid = next(t for t, name in engine_threads(found).items() if name == args.engine)
            pid = found[tid][2]

            def sample() -> None:
                time.sleep(args.delay_s)
                raws["gil"] = spy(pid, args.seconds, gil=True)
                raws["wall"] = spy(pid, args.seconds, gil=False)

            sampler = threading.Thread(target=sample)
            sampler.start()
            client = run_bench("profile", args.scenario, PORT, bench, model, dataset)
            sampler.join()
        finally:
            stop(proc)
    for mode, raw in raws.items():  # every thread's stacks, for a look beyond the engine thread's parts
        (WORK / f"{args.out}_{mode}.txt").write_text(raw)
    results = {mode: parts_of(raw, args.engine) for mode, raw in raws.items()}
    command = "python benchmarks/diagnostics/engine_profile.py " + " ".join(sys.argv[1:])
    payload = {"command": command, "client": {k: client.get(k) for k in CLIENT}, "samples": results}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(payload, indent=1))
    names = [part for part, _ in PARTS] + [OTHER]
    lines = [
        f"# Where the {args.engine} thread's time goes in service, scenario `{args.scenario}`",
        "",
        f"Command: `{command}`  ",
        f"tetriserve's defaults{' with ' + args.flags if args.flags else ''}, warmed up as in `vllm_bench_serve.py`; "
        f"vLLM's benchmark client, scenario `{args.scenario}` (ShareGPT, seed 0, `--ignore-eos`). From "
        f"{args.delay_s:g} s into it, py-spy sampled the engine's process at 200 Hz for {args.seconds:g} s only "
        f"while a thread held the interpreter lock (`gil`), then for {args.seconds:g} s by the wall clock (`wall`). "
        "Each cell: the part's share of the engine thread's samples (the first part in the script's `PARTS` whose "
        "frame is on the sample's stack).",
        "",
        "| part | " + " | ".join(results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]
    for part in names:
        cells = [f"{counts.get(part, 0) / max(total, 1):.1%}" for total, counts in results.values()]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| samples of the engine thread | " + " | ".join(str(t) for t, _ in results.values()) + " |")
    lines += ["", "Client: " + ", ".join(f"{k} {v:.4g}" for k, v in payload["client"].items() if v is not None)]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
