"""Where a served engine's time goes: its steps, its thread's CPU, and its waits for a core.

    python benchmarks/diagnostics/engine_steps.py --scenario saturation --repeats 2 \
        --variant nice5="--decode-niceness 5" --variant nice0="--decode-niceness 0"

Each ``--variant NAME=FLAGS`` runs on a fresh ``tetriserve serve`` (extra ``FLAGS``) with the benchmark ports and
KV size of ``vllm_bench_serve.py``, warmed up the same way, then one scenario of vLLM's benchmark client
(``rate``, ``single`` or ``saturation``, as there, with ``--ignore-eos``). Around the scenario it reads the
front door's ``/metrics``
(each worker's ``engine_steps``, ``engine_step_seconds`` by wall and CPU clock, generated tokens) and
``/proc/<pid>/task/<tid>/schedstat`` of every thread of the server's processes (CPU time, and time spent
runnable but waiting for a core). Engine threads are found by their OS name (``eng-<worker>``). During the
scenario it also samples each engine thread's schedstat every ``SAMPLE_S``: in the samples where the thread had
work (on a CPU or waiting for one at least half the time), the median shares of running, waiting for a core,
and neither (blocked: on the interpreter lock, a sleep or a queue): the lock's direct cost to the engine is at
most the last (``busy_*_share``). With ``--who`` it also samples the CPU time of every thread of the server and
of every other process on the machine (the benchmark client's included), and reports which used the cores in
each engine thread's busy samples. A variant named by a placement flag (``PLACEMENTS``: ``--pin``,
``--pin-engines``, ``--pin-free-prefill``, ``--pin-engines-apart``, ``--pin-model``) has its decode engine
threads, prefill engine threads and every other thread of the server's processes put on core 0, the other
cores, every core, or left to the kernel after the warm-up (the benchmark client is left alone; vLLM's CPU
server binds its model worker to core 0); with ``--renice-rest NAME`` every thread of the server but the
engines' runs at niceness ``RENICE_TO`` instead, with ``--renice-front-door NAME`` every thread of the
``serve`` process (the front door; Ray's processes and the workers are its children, not it); ``--batch-rest
NAME`` and ``--batch-front-door NAME`` put the same threads in ``SCHED_BATCH`` instead. With ``--code
NAME=COMMIT`` variant ``NAME``'s server runs the code of ``COMMIT`` (``variant_envs``) instead of the working
tree's, to compare two commits side by side:

    python benchmarks/diagnostics/engine_steps.py --scenario rate --repeats 3 --variant head= --variant base= \
        --code base=COMMIT

Variants alternate from one repeat to the next. Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import command_line
from thread_timeline import BUSY, SAMPLE_S, Timeline, competitors, engine_threads, peers_cpu_s, threads
from vllm_bench_report import RESULTS, add_code_option, code_line, variant_envs
from vllm_bench_serve import prepare, run_bench, warmed_server, worker_series

PORT = 8100  # tetriserve_cmd's HTTP port
URL = f"http://127.0.0.1:{PORT}"
CLIENT = ("completed", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput")
_KEYS = {  # figure -> (series, clock) on /metrics
    "steps": ("engine_steps", ""),
    "borrowed": ("engine_borrowed_steps", ""),
    "tokens": ("engine_generation_tokens", ""),
    "wall": ("engine_step_seconds", "wall"),
    "cpu": ("engine_step_seconds", "cpu"),
    "offloaded": ("kv_handoffs", "offloaded"),  # a prefill worker's prompts computed by decode workers
    "slept": ("engine_step_context_switches", "slept"),  # the stepping thread slept inside a step
    "preempted": ("engine_step_context_switches", "preempted"),
}
RENICE_TO = 10  # the niceness ``--renice-rest`` and ``--renice-front-door`` give the threads they name
FRONT_DOOR, REST = "the front door's threads", "every thread but the engines'"
NICE, BATCH = f"at niceness {RENICE_TO}", "in SCHED_BATCH (never preempting on wake-up)"
RENICED = {  # mode -> (the threads it names, what it does to them)
    "renice_rest": (REST, NICE),
    "renice_front_door": (FRONT_DOOR, NICE),
    "batch_rest": (REST, BATCH),
    "batch_front_door": (FRONT_DOOR, BATCH),
}
ZERO, OTHERS, EVERY, KERNEL = "core 0", "the others", "every core", "the kernel's choice"  # where threads go
# flag -> (decode engine threads, prefill engine threads, every other thread of the server)
PLACEMENTS: dict[str, tuple[str, str, str]] = {
    "pin": (ZERO, OTHERS, OTHERS),
    "pin_engines": (ZERO, OTHERS, KERNEL),
    "pin_free_prefill": (ZERO, EVERY, OTHERS),
    "pin_engines_apart": (ZERO, ZERO, OTHERS),
    "pin_model": (ZERO, ZERO, KERNEL),
}


def placement_label(mode: str) -> str:
    if mode in RENICED:
        return " ".join(RENICED[mode])
    decode, prefill, rest = PLACEMENTS[mode]
    return f"decode on {decode}, prefill on {prefill}, the rest on {rest}"


PINNED = {mode: f" ({placement_label(mode)})" for mode in (*PLACEMENTS, *RENICED)}


def client_args(args: argparse.Namespace) -> argparse.Namespace:
    """What ``run_bench`` takes: the scenario sizes and seed in ``args``, ``--ignore-eos``."""
    return argparse.Namespace(
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        single_prompts=args.single_prompts,
        seed=args.seed,
        ignore_eos=True,
    )


def pin(sid: int, mode: str) -> int:
    """Put the session's threads where placement ``mode`` says (or renice some, ``RENICED``); returns how
    many engine threads went to core 0 (how many threads were reniced)."""
    if mode in RENICED:
        return renice(sid, mode)
    cores = os.sched_getaffinity(0)
    where = {ZERO: {0}, OTHERS: cores - {0} or cores, EVERY: cores}
    decode, prefill, rest = PLACEMENTS[mode]
    pinned = 0
    for tid, (name, _, _) in threads(sid).items():
        place = decode if name.startswith("eng-decode") else prefill if name.startswith("eng-") else rest
        if place == KERNEL:
            continue
        try:
            os.sched_setaffinity(tid, where[place])
            pinned += place == ZERO and name.startswith("eng-")
        except OSError:
            continue
    return pinned


def renice(sid: int, mode: str) -> int:
    """``renice_rest``: every thread of the session but the engines' (front doors, Ray, the workers' event
    loops, the predictor) at niceness ``RENICE_TO``, so that the engines go first on the cores;
    ``renice_front_door``: the threads of the session's leader, the ``serve`` process, so that a prompt goes
    before the token stream on the rest's cores. ``batch_*``: the same threads in ``SCHED_BATCH`` instead, at
    their weight but never preempting a running thread when they wake (a token arriving at the front door then
    waits for the engine's slice to end rather than cutting it). Returns how many were changed."""
    done, (which, how) = 0, RENICED[mode]
    for tid, (name, _, pid) in threads(sid).items():
        if (pid == sid) if which == FRONT_DOOR else not name.startswith("eng-"):
            try:
                if how == BATCH:
                    os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                else:
                    os.setpriority(os.PRIO_PROCESS, tid, RENICE_TO)
                done += 1
            except OSError:
                continue
    return done


def pinning(name: str, args: argparse.Namespace) -> str | None:
    """How variant ``name`` is pinned or reniced: a key of ``PINNED`` (the flag that named it), or None."""
    return next((mode for mode in PINNED if name in getattr(args, mode)), None)


def engine_figures(
    before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float], span_s: float
) -> dict[str, dict[str, float]]:
    """Per worker, what its engine did between two ``worker_series`` scrapes: steps, the share of ``span_s``
    spent inside steps (``busy_share``), time per step by the wall and the CPU clock, tokens per step, borrowed
    cores, offloaded prompts, context switches per step."""
    engines = {}
    for worker in sorted({w for _, w, _ in after if w}):
        d = {key: after.get((k, worker, c), 0) - before.get((k, worker, c), 0) for key, (k, c) in _KEYS.items()}
        steps = max(d["steps"], 1)
        engines[worker] = {
            "steps": d["steps"],
            "busy_share": d["wall"] / span_s,
            "ms_per_step_wall": 1e3 * d["wall"] / steps,
            "ms_per_step_cpu": 1e3 * d["cpu"] / steps,
            "tokens_per_step": d["tokens"] / steps,
            "borrowed_share": d["borrowed"] / steps,
            "prompts_offloaded": d["offloaded"],
            "sleeps_per_step": d["slept"] / steps,
            "preemptions_per_step": d["preempted"] / steps,
        }
    return engines


def measure(name: str, flags: str, scenario: str, args: argparse.Namespace, env: Any) -> dict:
    model, dataset = args.model, args.dataset
    bench_args = client_args(args)
    with warmed_server(f"steps_{name}", flags, bench_args, model, dataset, env) as proc:
        mode = pinning(name, args)
        n_pinned = pin(proc.pid, mode) if mode else 0
        time.sleep(2)  # the warm-up's last steps counted before the scrape
        before, t_before, started = worker_series(), threads(proc.pid), time.monotonic()
        steppers = engine_threads(t_before)
        timeline = Timeline(steppers, proc.pid if args.who else None)
        client = run_bench(f"steps_{name}", scenario, PORT, bench_args, model, dataset)
        t_after, seconds = threads(proc.pid), time.monotonic() - started
        busy = timeline.stop()
        time.sleep(2)
        after = worker_series()
    engines = engine_figures(before, after, seconds)
    waits = {}
    for tid, tname in steppers.items():
        if tid in t_after:
            cpu, wait, _ = t_after[tid][1]
            cpu0, wait0, _ = t_before[tid][1]
            waits[tname] = {
                "cpu_s": (cpu - cpu0) / 1e9,
                "peers_cpu_s": peers_cpu_s(tid, t_before, t_after),
                "runqueue_wait_s": (wait - wait0) / 1e9,
                **busy.get(tname, {}),
            }
    return {"client": {k: client.get(k) for k in CLIENT}, "engines": engines, "threads": waits, "pinned": n_pinned}


def _flat(run: dict) -> dict[str, float]:
    """One run's figures as "<client, worker or thread> <figure>" -> value."""
    out = {f"client {k}": float(v) for k, v in run["client"].items() if v is not None}
    for worker, e in run["engines"].items():
        out.update({f"{worker} {k}": float(v) for k, v in e.items()})
    for tname, t in run["threads"].items():
        out.update({f"{tname} {k}": float(v) for k, v in t.items() if k != "busy_cores"})
    return out


def median_row(label: str, values: list[list[float]]) -> str:
    """A report's row: per column the median of its repeats' values, each repeat's value after it ("-": none)."""
    cells = [f"{statistics.median(v):.4g} ({', '.join(f'{x:.4g}' for x in v)})" if v else "-" for v in values]
    return f"| {label} | " + " | ".join(cells) + " |"


def write_report(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    names = list(runs)
    keys = sorted({k for rs in runs.values() for r in rs for k in _flat(r)})
    lines = [
        "# Engine steps, CPU and waits for a core in service",
        "",
        f"Command: `{command_line()}`  ",
        code_line(args),
        f"Scenario `{args.scenario}` of vLLM's benchmark client (ShareGPT, seed {args.seed}, `--ignore-eos`), on a "
        "fresh server per run after the 64-prompt warm-up; variants alternate from one repeat to the next. Each "
        "cell: the median over repeats (each repeat's value after it). `ms_per_step_*`: time inside engine steps per "
        "step by the "
        "wall clock and by the stepping thread's CPU clock; `borrowed_share`: the share of steps taken with cores "
        "borrowed from an idle engine (`--borrow-idle-cores`); `prompts_offloaded`: a prefill worker's prompts "
        "computed by decode workers (`prefill.offload_wait_s`); `sleeps_per_step`, `preemptions_per_step`: the "
        "stepping thread's voluntary and involuntary context switches inside its steps "
        "(`tetriserve:engine_step_context_switches_total`: it slept, mostly waiting for its process's interpreter "
        "lock; another thread took its core); `cpu_s`: the engine thread's CPU seconds, "
        "`peers_cpu_s`: those of the other threads of its process (the worker actor's event loop, Ray's threads), "
        "which share its interpreter lock; `runqueue_wait_s`: seconds the engine thread was "
        "runnable but waited for a core (schedstat); `busy_*_share`: sampled every "
        f"{SAMPLE_S} s, in the samples where the engine thread ran or waited for a core at least {BUSY:.0%} of the "
        "time (`busy_samples`), the median share it ran, waited for a core, and was blocked (neither: the "
        "interpreter lock, a sleep, a queue).",
        "",
        "| figure | " + " | ".join(n + PINNED.get(pinning(n, args) or "", "") for n in names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    lines += [median_row(key, [[f[key] for r in runs[n] if key in (f := _flat(r))] for n in names]) for key in keys]
    lines += competitors(runs)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"args": sys.argv[1:], "runs": runs}, indent=1) + "\n")
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("rate", "single", "saturation"), default="saturation")
    ap.add_argument("--variant", action="append", required=True, help="NAME=FLAGS (extra `tetriserve serve` flags)")
    for mode in (*PLACEMENTS, *RENICED):
        flag = "--" + mode.replace("_", "-")
        ap.add_argument(flag, action="append", default=[], help=f"a variant NAME: {placement_label(mode)}")
    ap.add_argument(
        "--who",
        action="store_true",
        help="also sample every thread of the server and every other process, and report what used the cores "
        "while each engine thread was busy",
    )
    add_code_option(ap)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--single-prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="the benchmark client's seed (prompt sample, arrivals)")
    ap.add_argument("--out", default="engine_steps")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    args.model, args.dataset, env = prepare()
    envs = variant_envs(args, variants, env)
    runs: dict[str, list[dict]] = {n: [] for n in variants}
    for rep in range(args.repeats):
        order = list(variants) if rep % 2 == 0 else list(variants)[::-1]
        for n in order:
            print(f"== repeat {rep + 1}/{args.repeats}: {n}", flush=True)
            runs[n].append(measure(n, variants[n], args.scenario, args, envs[n]))
    write_report(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
