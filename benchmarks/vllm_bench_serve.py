"""Side by side: vLLM's own benchmark client against tetriserve's HTTP front door and a plain vLLM server.

Both systems serve the same model on the same machine in one run, with the same
ShareGPT prompts and seed, in three scenarios:

    rate        Poisson arrivals at --request-rate (default 2 req/s), --num-prompts prompts
    single      one stream at a time (--max-concurrency 1), --single-prompts prompts
    saturation  every prompt at once (--request-rate inf), --num-prompts prompts

    python benchmarks/vllm_bench_serve.py --num-prompts 200 --request-rate 2 --seed 0 --rounds 3

This machine's speed drifts by up to 2x within an hour, for both systems, so one
pair of runs says little. The run is made of ``--rounds`` rounds; in each, every
scenario runs on a fresh server of each system, the two back to back, which one
goes first alternating from one scenario and one round to the next. Before a server
starts, every process of the one before it (Ray's included) has exited. A
scenario's ratio (tetriserve / vLLM) is the median of its per-round ratios, each
taken between two runs minutes apart; the report lists every round's ratio too.

The client sends ``ignore_eos`` (``--no-ignore-eos`` turns it off), so both
systems generate every request's ShareGPT output length. The model has random
weights: a sampled EOS ends a response early at random, on either system.
Throughput at saturation is output tokens over the time until the last response
ends, and the last is the longest (1195 tokens at seed 0) unless an EOS cut it
short, which without ``ignore_eos`` decides the ratio at random. The report's last
section shows, for every saturation run, which response ended last, with its
length, TTFT and end.

Writes ``benchmarks/results/vllm_bench_serve.{md,json}`` (``--out``): per system, scenario
and round the benchmark client's JSON summary; tables of medians over rounds, the
per-round ratios, and the targets (tetriserve / vLLM: TTFT and TPOT at 2 req/s at most
1.5 and 1.2, one-stream TPOT at most 1.2, saturation throughput at least 1.0) judged
on the median ratio. Beside them,
``<out>_per_request.json`` keeps the rate and saturation runs' per-request figures
the report's last sections read (TPOT split at the second token; the response that
ended last): ``python benchmarks/vllm_bench_report.py <that file>`` prints them again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench_results import run_facts
from vllm_bench_report import RESULTS, ROOT, SCENARIOS, WARMUP_PROMPTS, WORK, run_name, summary, write_report


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def stop(proc: subprocess.Popen[bytes], settle_s: float = 3.0) -> None:
    """Stop a server started in a session of its own and wait until every process of that session has exited
    (Ray's GCS, raylet and workers, vLLM's engine core), so that none of them runs beside the next server."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 60
    while session_alive(proc.pid):
        if time.monotonic() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.5)
    time.sleep(settle_s)


def all_processes() -> Iterator[tuple[Path, list[str]]]:
    """Every process on the machine: its ``/proc/<pid>`` and the fields of its ``stat`` after the name (state ppid
    pgrp session ... utime stime at 11 and 12)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            yield stat.parent, stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue


def session_processes(sid: int) -> Iterator[tuple[Path, list[str]]]:
    """Every process of session ``sid``, as ``all_processes`` gives them."""
    return ((proc, fields) for proc, fields in all_processes() if int(fields[3]) == sid)


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds in a process's ``stat`` fields (as ``all_processes`` gives them)."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def label_of(proc: Path) -> str | None:
    """``process_label`` of the process at ``/proc/<pid>``; None once it is gone."""
    try:
        return process_label((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        return None


def session_cpu(sid: int) -> dict[str, tuple[str, float]]:
    """CPU seconds (user + system) so far of every live process of session ``sid``: pid -> (its command line,
    shortened; seconds)."""
    out = {}
    for proc, fields in session_processes(sid):
        if (label := label_of(proc)) is not None:
            out[proc.name] = (label, cpu_seconds(fields))
    return out


def process_label(cmdline: str) -> str:
    """A process's command line, short: Ray names its actors' processes (``ray::GlobalScheduler``), vLLM its
    engine's; a Python program is named by its module or script."""
    words = cmdline.split()
    if not words:
        return "?"
    if not words[0].endswith(("python", "python3")) or len(words) < 2:
        return Path(words[0]).name
    if words[1] == "-m" and len(words) > 2:
        return words[2]
    if words[1] == "-c":
        return "python -c (benchmark client)"
    return Path(next((w for w in words[1:] if not w.startswith("-")), words[1])).name


def cpu_by_process(
    before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]], seconds: float
) -> dict[str, float]:
    """Cores each process used between two ``session_cpu`` samples ``seconds`` apart, by label (processes that
    share a label numbered by pid), the processes that used under 0.5% left out."""
    used: dict[str, float] = {}
    for pid, (label, cpu) in sorted(after.items(), key=lambda kv: int(kv[0])):
        share = (cpu - before.get(pid, (label, 0.0))[1]) / seconds
        if share >= 0.005:
            name, n = label, 2
            while name in used:
                name, n = f"{label} #{n}", n + 1
            used[name] = round(share, 3)
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))


def session_alive(sid: int) -> bool:
    """Whether any process of session ``sid`` is still alive (zombies excluded)."""
    return any(fields[0] != "Z" for _, fields in session_processes(sid))


def scenario_args(scenario: str, args: argparse.Namespace) -> list[str]:
    if scenario == "rate":
        return ["--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate)]
    if scenario == "warmup":  # every batch shape the measured runs will meet: compiled graphs, caches
        return ["--num-prompts", str(WARMUP_PROMPTS), "--request-rate", "inf"]
    if scenario == "smoke":  # a user's first requests: the client's own test prompt, then one more
        return ["--num-prompts", "1", "--request-rate", "inf"]
    if scenario == "single":
        return ["--num-prompts", str(args.single_prompts), "--request-rate", "inf", "--max-concurrency", "1"]
    return ["--num-prompts", str(args.num_prompts), "--request-rate", "inf"]


def client_command(
    port: int, model: str, dataset: Path, result: str, load: Sequence[str], seed: int, ignore_eos: bool
) -> list[str]:
    """vLLM's benchmark client against ``port`` on a ShareGPT file, ``load`` its request count and rate flags,
    saving its summary and per-request detail as ``WORK/<result>``."""
    return [
        sys.executable,
        "-c",
        "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
        "from vllm.benchmarks.serve import add_cli_args, main; "
        "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))",
        "--backend",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        "tiny-llama",
        "--tokenizer",
        model,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        *load,
        "--seed",
        str(seed),
        "--save-result",
        "--result-dir",
        str(WORK),
        "--result-filename",
        result,
        "--save-detailed",
        *(["--ignore-eos"] if ignore_eos else []),
    ]


def run_bench(
    name: str, scenario: str, port: int, args: argparse.Namespace, model: str, dataset: Path
) -> dict[str, float]:
    out = WORK / f"bench_{name}_{scenario}.json"
    load = scenario_args(scenario, args)
    cmd = client_command(port, model, dataset, out.name, load, args.seed, getattr(args, "ignore_eos", False))
    print(f"[{name} / {scenario}] {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return summary(name, scenario)


TETRISERVE_PORT = 8100


ENGINE_COUNTERS = (
    "engine_steps",
    "engine_borrowed_steps",
    "engine_step_seconds",
    "engine_generation_tokens",
    "kv_handoffs",
    "engine_step_context_switches",
)
_SERIES = re.compile(r"tetriserve:(\w+?)(?:_total)?\{([^}]*)\} (\S+)")


def worker_series(
    role: str | None = None, names: tuple[str, ...] = ENGINE_COUNTERS
) -> dict[tuple[str, str, str], float]:
    """(series, worker, clock, source or mode) -> value of every worker's series named in ``names`` (a counter's
    name without ``_total``; by default the step and handoff counters) on the ``/metrics`` of the front door on
    ``TETRISERVE_PORT`` (``role``: of the workers in that role only)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{TETRISERVE_PORT}/metrics", timeout=30).read().decode()
    out = {}
    for m in _SERIES.finditer(text):
        if m.group(1) not in names:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if role is not None and labels.get("role") != role:
            continue
        kind = labels.get("clock") or labels.get("source") or labels.get("kind") or labels.get("mode", "")
        out[(m.group(1), labels.get("worker", ""), kind)] = float(m.group(3))
    return out


def tetriserve_cmd(*extra: str) -> list[str]:
    """`tetriserve serve` on the benchmark ports, KV cache sized like the vLLM server's."""
    return [
        sys.executable,
        "-m",
        "tetriserve.cli.main",
        "serve",
        "--http-port",
        str(TETRISERVE_PORT),
        "--grpc-port",
        "50151",
        "--served-model-name",
        "tiny-llama",
        "--kv-cache-gb",
        "2",
        *extra,
    ]


@contextmanager
def serving(cmd: Sequence[str], env: dict[str, str], log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Server ``cmd`` in a session of its own (stdout and stderr to ``log``), answering on ``port`` when entered;
    stopped, every process of its session gone, on exit."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            yield proc
        finally:
            stop(proc)


@contextmanager
def warmed_server(
    name: str,
    flags: str,
    args: argparse.Namespace,
    model: str,
    dataset: Path,
    env: dict[str, str],
    warmup: str = "warmup",
) -> Iterator[subprocess.Popen[bytes]]:
    """A fresh ``tetriserve serve`` (extra ``flags``) on the benchmark ports (``tetriserve_cmd``), answering and
    warmed up by scenario ``warmup`` (``WARMUP_PROMPTS`` at once, not measured; ``smoke``: two single prompts), its
    log in ``_work/server_<name>.log``; stopped on exit."""
    with serving(tetriserve_cmd(*shlex.split(flags)), env, WORK / f"server_{name}.log", TETRISERVE_PORT) as proc:
        run_bench(name, warmup, TETRISERVE_PORT, args, model, dataset)
        yield proc


def vllm_server(
    model: str, port: int, env: dict[str, str], threads: int | None = None, extra: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """A plain vLLM OpenAI server on ``port`` (command, environment): same model, dtype, context and block size
    as tetriserve's engines, its KV cache sized like theirs. ``threads``: its engine's threads, unbound as
    tetriserve's engines are (None: vLLM binds one to each core, two here); ``extra``: more server flags."""
    from tetriserve.common.config import ClusterConfig
    from tetriserve.engine.settings import engine_dtype

    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        "tiny-llama",
        "--dtype",
        engine_dtype("auto"),  # what tetriserve's engines resolve their default to on this machine
        "--max-model-len",
        "2048",
        "--block-size",
        "32",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *extra,
    ]
    # idle HTTP connections kept as long as tetriserve's front door keeps them (``http_keepalive_s``, 75 s), not
    # vLLM's 5 s: the client pools its connections for 60 s, and one the server closes as the client reuses it
    # fails that request (``ServerDisconnectedError``)
    keepalive = str(math.ceil(ClusterConfig().http_keepalive_s))
    senv = dict(env, OMP_NUM_THREADS="2", VLLM_CPU_KVCACHE_SPACE="2", VLLM_HTTP_TIMEOUT_KEEP_ALIVE=keepalive)
    if threads is not None:
        senv.update(OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    return cmd, senv


def serve_and_bench(
    name: str,
    cmd: list[str],
    port: int,
    env: dict[str, str],
    args: argparse.Namespace,
    model: str,
    dataset: Path,
    scenario: str,
) -> dict[str, float]:
    """Start a server, wait until it answers, warm it up, run one scenario against it, stop it."""
    with open(WORK / f"server_{name}_{scenario}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            run_bench(name, "warmup", port, args, model, dataset)  # not measured
            before, started = session_cpu(proc.pid), time.monotonic()  # every process of the server's
            run_bench(name, scenario, port, args, model, dataset)
            cpu = cpu_by_process(before, session_cpu(proc.pid), time.monotonic() - started)
            (WORK / f"cpu_{name}_{scenario}.json").write_text(json.dumps(cpu, indent=1))
            return summary(name, scenario)
        finally:
            stop(proc)


def prepare() -> tuple[str, Path, dict[str, str]]:
    """The tiny model, a valid ShareGPT JSON for the client, and the servers' environment."""
    sys.path.insert(0, str(ROOT))
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.sharegpt import write_valid_json

    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = str(build_tiny_model(default_tiny_model_dir()))
    dataset = WORK / "sharegpt.json"
    if not dataset.exists():
        write_valid_json(dataset)
    return model, dataset, dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200, help="prompts of the rate and saturation scenarios")
    ap.add_argument("--request-rate", type=float, default=2.0, help="Poisson arrival rate of the rate scenario")
    ap.add_argument("--single-prompts", type=int, default=50, help="prompts of the one-stream scenario")
    ap.add_argument("--seed", type=int, default=0, help="the benchmark client's seed (prompt sample, arrivals)")
    ap.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every request generates its dataset output length on both systems (see above); "
        "--no-ignore-eos lets a sampled EOS end it",
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every scenario on both systems (see above)")
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="which scenarios to run")
    ap.add_argument(
        "--systems", nargs="+", choices=("tetriserve", "vllm"), default=["tetriserve", "vllm"], help="which servers"
    )
    ap.add_argument(
        "--tetriserve-flags",
        default="",
        help="extra `tetriserve serve` flags, e.g. --tetriserve-flags=--borrow-idle-cores (recorded in the report)",
    )
    ap.add_argument("--out", default="vllm_bench_serve", help="report name under benchmarks/results (.md, .json)")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the last run's saved results (give that run's arguments); run nothing",
    )
    args = ap.parse_args()
    systems_all = ("tetriserve", "vllm")
    if args.report_only:
        saved = RESULTS / f"{args.out}.json"
        facts = json.loads(saved.read_text()).get("facts", {}) if saved.exists() else {}
        results = {
            n: {s: [summary(run_name(n, r), s) for r in range(args.rounds)] for s in SCENARIOS} for n in systems_all
        }
        write_report(results, args, facts or run_facts())
        return 0
    facts = run_facts()
    model, dataset, env = prepare()
    vllm_cmd, vllm_env = vllm_server(model, 8101, env)
    systems = {
        "tetriserve": (
            tetriserve_cmd(*shlex.split(args.tetriserve_flags)),
            8100,
            env,
        ),
        "vllm": (vllm_cmd, 8101, vllm_env),
    }
    results: dict[str, dict[str, list[dict[str, float]]]] = {n: {s: [] for s in args.scenarios} for n in args.systems}
    # scenario by scenario, the two systems back to back (the first one alternating), so that the two runs of a
    # scenario are minutes apart, not half an hour: this machine's speed drifts more than that
    turn, step, steps, started = 0, 0, args.rounds * len(args.scenarios) * len(args.systems), time.monotonic()
    for rnd in range(args.rounds):
        for scenario in args.scenarios:
            order = args.systems if turn % 2 == 0 else args.systems[::-1]
            turn += 1
            for name in order:
                cmd, port, senv = systems[name]
                step += 1
                elapsed = (time.monotonic() - started) / 60
                print(f"== [{step}/{steps}] round {rnd + 1}/{args.rounds}, {scenario}, {name} "
                      f"({elapsed:.0f} min so far)", flush=True)  # fmt: skip
                run = serve_and_bench(run_name(name, rnd), cmd, port, senv, args, model, dataset, scenario)
                results[name][scenario].append(run)
    if len(results) < 2 or set(args.scenarios) != set(SCENARIOS):  # a partial run: summaries only, no report
        print(json.dumps(results, indent=2))
        return 0
    write_report(results, args, facts)
    return 0 if all(r.get("failed", 1) == 0 for s in results.values() for runs in s.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
