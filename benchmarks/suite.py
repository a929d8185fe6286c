"""The benchmark suite: every benchmark whose current result lives in ``benchmarks/results/``, run one after another.

    python benchmarks/suite.py                     # the whole suite, in order (many hours on 2 cores)
    python benchmarks/suite.py --list              # what each entry measures, its command, its rough duration
    python benchmarks/suite.py --only flip_time    # one entry (or several: --only a b c)
    python benchmarks/suite.py --skip vllm_bench_serve vllm_bench_serve_seed1
    python benchmarks/suite.py --dry-run           # print the commands, run nothing

(or ``python -m benchmarks.suite ...``). Each entry is one command that writes its result files under
``benchmarks/results/`` (``<name>.md`` with the command, machine, commit and date at its head; ``.json`` with
the raw figures; ``.png`` where a plot helps), replacing what was there. The suite runs them one after another,
each from the repository root in this interpreter, with a line as each starts (``[10/25] flip_time (about 3
min) ...``) and the entry's own progress below it, and ends with a table: each entry ok, failed or skipped, its
time, and the result files it wrote. A failing entry does not stop the rest; the exit status is 1 if any
failed. An entry that needs a GPU is skipped where CUDA is absent.

Adding a benchmark to the suite is adding an ``Entry`` to ``REGISTRY``: its name (the script's, and the stem of
its result files), its command, what it measures, its rough duration on the 2-core development machine, whether
it needs a GPU, and the result files it writes.

Run one entry at a time on a quiet machine: every benchmark here times something, and another job on the same
cores moves its figures. The side-by-side entries alternate the two systems within a run for that reason.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Entry:
    """One benchmark of the suite."""

    name: str  # the script's name and its results' stem (``<name>.md``, ``<name>_<part>.*``)
    command: tuple[str, ...]  # run as ``python <command...>`` from the repository root
    measures: str  # one line: what it measures
    minutes: float  # rough duration on the 2-core development machine
    results: tuple[str, ...]  # the files it writes under benchmarks/results/
    gpu: bool = False  # needs a CUDA GPU (skipped without one)

    @property
    def script(self) -> Path:
        """The script the command runs."""
        return ROOT / self.command[0]

    def shell(self) -> str:
        """The command as a user types it from the repository root."""
        return shlex.join(["python", *self.command])


def _bench(name: str, args: str = "") -> tuple[str, ...]:
    """``benchmarks/<name>.py`` and its arguments, written as on a command line."""
    return (f"benchmarks/{name}.py", *shlex.split(args))


def _files(stem: str, *suffixes: str) -> tuple[str, ...]:
    return tuple(f"{stem}{s}" for s in suffixes)


REGISTRY: tuple[Entry, ...] = (
    Entry(
        "vllm_bench_serve",
        _bench("vllm_bench_serve", "--num-prompts 200 --request-rate 2.0 --single-prompts 50 --seed 0 --rounds 3"),
        "tetriserve side by side with plain vLLM (vLLM's benchmark client): 2 req/s, one stream, saturation",
        90,
        _files("vllm_bench_serve", ".md", ".json", "_per_request.json"),
    ),
    Entry(
        "vllm_bench_serve_seed1",
        _bench(
            "vllm_bench_serve",
            "--num-prompts 300 --request-rate 2.0 --single-prompts 50 --seed 1 --rounds 3 --out vllm_bench_serve_seed1",
        ),
        "the same side by side on another seed and 300 prompts",
        110,
        _files("vllm_bench_serve_seed1", ".md", ".json", "_per_request.json"),
    ),
    Entry(
        "vllm_bench_serve_colocated",
        _bench(
            "vllm_bench_serve",
            "--num-prompts 60 --single-prompts 15 --request-rate 2 --seed 0 --rounds 1 "
            "'--tetriserve-flags=--mode colocated' --out vllm_bench_serve_colocated",
        ),
        "the side by side with tetriserve in colocated mode: two engines that each prefill and decode",
        12,
        _files("vllm_bench_serve_colocated", ".md", ".json", "_per_request.json"),
    ),
    Entry(
        "vllm_bench_two_commits",
        _bench(
            "vllm_bench_two_commits",
            "--before 0d57bfc --after HEAD --pairs 3 --num-prompts 60 --single-prompts 15 --request-rate 2 --seed 0",
        ),
        "two commits of tetriserve, each beside plain vLLM, in interleaved pairs: ratios and the handoff",
        55,
        _files("vllm_bench_two_commits", ".md", ".json"),
    ),
    Entry(
        "transport_throughput",
        _bench("transport_throughput", "--sizes-mib 1 4 16 64 256 --repeats 5 --rounds 5"),
        "GB/s of each KV transport (shm push and pull, tcp, ucx, nccl) beside the raw path it rides",
        15,
        _files("transport_throughput", ".md", ".json"),
    ),
    Entry(
        "transfer_breakdown",
        _bench("transfer_breakdown", "--requests 20 --prompt-tokens 1536 --pipeline both"),
        "a request's time to its first decoded token, part by part, per transport and emulated link",
        12,
        _files("transfer_breakdown", ".md", ".json"),
    ),
    Entry(
        "transfer_breakdown_pull",
        _bench(
            "transfer_breakdown",
            "--requests 20 --prompt-tokens 1536 --configs shm 'shm, pushed' "
            "--pipeline both --out transfer_breakdown_pull",
        ),
        "the same split for shm's pull against its push",
        5,
        _files("transfer_breakdown_pull", ".md", ".json"),
    ),
    Entry(
        "overload_goodput",
        _bench("overload_goodput", "--loads 0.5 1 2 3 5 --duration 60 --deadline 60 --max-tokens 256 --seed 0"),
        "goodput and refusals against offered load, with the admission bounds and without them",
        20,
        _files("overload_goodput", ".md", ".json", ".png"),
    ),
    Entry(
        "failure_kills",
        _bench("failure_kills", "--num-prompts 360 --request-rate 2 --kill-every 30 --seed 0"),
        "decode workers killed every 30 s under load: failed requests, and what the kills cost",
        15,
        _files("failure_kills", ".md", ".json"),
    ),
    Entry(
        "soak",
        _bench("soak", "--duration-s 3600 --window-s 600 --rate 1.0 --seed 0"),
        "an hour of steady load, a prefill worker, a decode worker or the GlobalScheduler killed every 10 minutes: "
        "requests lost, and the service's memory, descriptors, /dev/shm, object store and KV after each drain",
        62,
        _files("soak", ".md", ".json"),
    ),
    Entry(
        "failure_signals",
        _bench("failure_signals", "--streams 12 --max-tokens 1000"),
        "workers stopped or killed by signals under streaming load: does every stream end whole and unchanged",
        10,
        _files("failure_signals", ".md", ".json"),
    ),
    Entry(
        "failure_signals_float32",
        _bench(
            "failure_signals",
            "--streams 12 --max-tokens 1000 --flags '--dtype float32' --out failure_signals_float32",
        ),
        "the same in float32, where a moved greedy stream's text must match the undisturbed one",
        12,
        _files("failure_signals_float32", ".md", ".json"),
    ),
    Entry(
        "flip_time",
        _bench("flip_time", "--flips 10"),
        "a role flip: the swap on the engine, the switch the control plane sees, order to first request served",
        3,
        _files("flip_time", ".md", ".json"),
    ),
    Entry(
        "flip_phases",
        _bench("flip_phases", "--seconds-per-phase 45 --seed 0"),
        "fixed roles against the tetriinfer and slo flip policies on a phase-changing workload",
        15,
        _files("flip_phases", ".md", ".json", ".png"),
    ),
    Entry(
        "cost_profile",
        _bench("cost_profile", "--threads 1"),
        "the tiny model's cost profile: SOLA eq. 3/4 fitted to timed steps, and the pivot S_pf the prefill entries use",
        3,
        _files("cost_profile", ".md", ".json", ".png"),
    ),
    Entry(
        "prefill_policies",
        _bench("prefill_policies", "--num-prompts 128 --rounds 5"),
        "TetriInfer Fig. 16: prefill wait and TTFT of FCFS, SJF and LJF at two batch sizes; chunked or not",
        5,
        _files("prefill_policies", ".md", ".json", ".png"),
    ),
    Entry(
        "prefill_slo",
        _bench("prefill_slo", "--num-prompts 200 --load 0.9 --rounds 5"),
        "AccelGen's setting: TTFT-SLO attainment with heterogeneous SLOs, and each policy's scheduling overhead",
        8,
        _files("prefill_slo", ".md", ".json", ".png"),
    ),
    Entry(
        "decode_policies",
        _bench("decode_policies"),
        "TetriInfer Fig. 18 admission; CacheOpt Fig. 7 preemption order and Fig. 8 swap against recompute",
        35,
        (*_files("decode_policies", ".md", ".json"), "decode_policies_preemption_profile.json"),
    ),
    Entry(
        "decode_dispatch",
        _bench("decode_dispatch"),
        "TetriInfer Fig. 19 dispatch (power-of-two, random, imbalance) and SCLS Fig. 17 spread, trained estimates",
        25,
        _files("decode_dispatch", ".md", ".json"),
    ),
    Entry(
        "decode_dispatch_oracle",
        _bench(
            "decode_dispatch",
            "--engines 2 4 --estimates oracle --heavy 345 --out benchmarks/results/decode_dispatch_oracle",
        ),
        "the same dispatch with exact lengths and heavy at the workload's median",
        15,
        _files("decode_dispatch_oracle", ".md", ".json"),
    ),
    Entry(
        "decode_slices",
        _bench("decode_slices"),
        "SCLS Fig. 17 with slices on the real cluster: completion-time spread of 4 decode workers",
        9,
        _files("decode_slices", ".md", ".json"),
    ),
    Entry(
        "decode_slices_2",
        _bench(
            "decode_slices",
            "--decode 2 --dispatch round-robin max-min imbalance --out benchmarks/results/decode_slices_2",
        ),
        "the same with 2 decode workers, imbalance dispatch included",
        8,
        _files("decode_slices_2", ".md", ".json"),
    ),
    Entry(
        "paper_policies",
        _bench("paper_policies", "--num-prompts 750 --rate 10 --seed 0 --rounds 3"),
        "each paper's policies (AccelGen, SOLA, SCLS, CacheOpt) against the default on one ShareGPT workload with "
        "per-request SLOs, colocated and disaggregated: SLO attainment, TTFT, TBT, JCT, throughput, preemptions",
        55,
        _files("paper_policies", ".md", ".json"),
    ),
    Entry(
        "tetriinfer_e2e",
        _bench(
            "tetriinfer_e2e",
            "--seeds 0 1 2 --num-prompts 64 --systems tetriinfer tetriinfer-oracle colocated vllm vllm-nochunk",
        ),
        "TetriInfer §5.1 live: its five workloads on the tetriinfer preset (predicted and true lengths) against "
        "colocated on the same two engines and plain vLLM with and without chunked prefill: burst capacity, "
        "perf/$ per CPU-second, TTFT and JCT under Poisson arrivals, three seeds with 95% intervals",
        100,
        _files("tetriinfer_e2e", ".md", ".json", ".png"),
    ),
    Entry(
        "slo_goodput",
        _bench("slo_goodput", "--scales 1 2"),
        "each preset in each mode it serves against plain vLLM under per-request TTFT, TBT and JCT SLOs set from "
        "the unloaded latency at two SLO scales: DistServe's goodput (90% meeting all three) as a bracket per "
        "engine thread, attainment per objective, p50/p99 latencies, preemptions",
        90,
        _files("slo_goodput", ".md", ".json", ".png"),
    ),
    Entry(
        "multi_turn",
        _bench("multi_turn", "--conversations 32 --turns 6 --seed 0"),
        "ShareGPT conversations replayed turn by turn on 2 prefill + 2 decode workers, prefix placement against "
        "least-load placement and against plain vLLM: TTFT per turn, prompt tokens computed and cached, hit rate, "
        "KV bytes sent",
        10,
        _files("multi_turn", ".md", ".json", ".png"),
    ),
    Entry(
        "length_predictor",
        _bench("length_predictor", "--granularity 100 200 400"),
        "the length predictor's held-out bucket accuracy, calibration and padded-estimate provisioning",
        3,
        (
            *_files("length_predictor", ".md", ".json"),
            *(f"length_predictor_confusion_g{g}.png" for g in (100, 200, 400)),
            "length_predictor_calibration.png",
            "length_predictor_provisioning.png",
        ),
    ),
    Entry(
        "predictor_serving",
        _bench("predictor_serving", "--prompts 256 --rounds 5"),
        "the length predictor's latency, and the prefill engine's throughput with it running beside",
        5,
        _files("predictor_serving", ".md", ".json"),
    ),
    Entry(
        "predictor_queue_wait",
        _bench("predictor_queue_wait"),
        "what a request's wait for its length prediction before it queues adds to TTFT, both modes",
        12,
        _files("predictor_queue_wait", ".md", ".json"),
    ),
    Entry(
        "tracing_overhead",
        _bench("tracing_overhead"),
        "what tracing costs a request, off (the default) and on",
        1,
        _files("tracing_overhead", ".md", ".json"),
    ),
    Entry(
        "frontdoor_inputs",
        _bench("frontdoor_inputs"),
        "malformed and edge-case requests against the HTTP front door: each one's status, error and time",
        2,
        _files("frontdoor_inputs", ".md", ".json"),
    ),
    Entry(
        "gpu_transport",
        _bench("gpu_transport", "--sizes-mib 1 4 16 64 256 --repeats 10"),
        "KV transport on a GPU: raw CUDA copies, NCCL, KV pack and unpack, a GPU-to-GPU handoff",
        3,
        _files("gpu_transport", ".md", ".json"),
        gpu=True,
    ),
    Entry(
        "gpu_ipc",
        _bench("gpu_ipc", "--sizes-mib 1 4 16 64 256 --repeats 10"),
        "what CUDA IPC between two processes on one GPU could reach for KV, beside host staging",
        2,
        _files("gpu_ipc", ".md", ".json"),
        gpu=True,
    ),
)


@dataclass
class Outcome:
    """How one entry went: ``ok``, ``failed`` (with the exit status) or ``skipped`` (with why)."""

    entry: Entry
    status: str
    seconds: float = 0.0
    detail: str = ""
    written: list[str] = field(default_factory=list)


def has_cuda() -> bool:
    """Whether torch sees a CUDA device (a GPU entry is skipped where it does not)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def select(registry: Sequence[Entry], only: Sequence[str], skip: Sequence[str]) -> list[Entry]:
    """The entries to run, in registry order: those named by ``only`` (all when empty), less ``skip``."""
    names = {e.name for e in registry}
    unknown = sorted((set(only) | set(skip)) - names)
    if unknown:
        raise SystemExit(f"no such suite entry: {', '.join(unknown)} (see --list)")
    return [e for e in registry if (not only or e.name in only) and e.name not in skip]


def minutes(m: float) -> str:
    """A rough duration as the listing and the progress lines give it: ``about 5 min``, ``about 1.5 h``."""
    return f"about {m:g} min" if m < 90 else f"about {m / 60:.1f} h"


def clock(seconds: float) -> str:
    """Elapsed time: ``3m07s``, ``1h02m``."""
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def listing(entries: Sequence[Entry]) -> str:
    lines = ["| entry | measures | command | duration (2 cores) | results |", "| --- | --- | --- | --- | --- |"]
    for e in entries:
        gpu = " (needs a GPU)" if e.gpu else ""
        lines.append(
            f"| {e.name} | {e.measures}{gpu} | `{e.shell()}` | {minutes(e.minutes)} | {', '.join(e.results)} |"
        )
    total = sum(e.minutes for e in entries if not e.gpu)
    lines += ["", f"{len(entries)} entries; about {total / 60:.1f} h on the 2-core machine, the GPU entries apart."]
    return "\n".join(lines)


def run(
    entries: Sequence[Entry],
    runner: Callable[[Entry], int],
    gpu_available: Callable[[], bool] = has_cuda,
    results: Path = RESULTS,
    out: Callable[[str], None] = print,
) -> list[Outcome]:
    """Run ``entries`` one after another with ``runner`` (which returns the exit status), printing a line as each
    starts and ends; a failure does not stop the rest. Returns each entry's outcome."""
    outcomes: list[Outcome] = []
    started = time.monotonic()
    cuda: bool | None = None
    for i, e in enumerate(entries, 1):
        head = f"[{i}/{len(entries)}] {e.name} ({minutes(e.minutes)})"
        if e.gpu:
            cuda = gpu_available() if cuda is None else cuda
            if not cuda:
                out(f"{head}: skipped, needs a CUDA GPU and sees none")
                outcomes.append(Outcome(e, "skipped", detail="no CUDA GPU"))
                continue
        out(f"{head} ... ({clock(time.monotonic() - started)} into the suite)")
        out(f"$ {e.shell()}")
        t0, wall = time.monotonic(), time.time()
        try:
            rc = runner(e)
        except Exception as exc:  # a runner that cannot start the command fails this entry only
            rc, detail = -1, f"{type(exc).__name__}: {exc}"
        else:
            detail = f"exit status {rc}" if rc else ""
        seconds = time.monotonic() - t0
        written = [n for n in e.results if (results / n).exists() and (results / n).stat().st_mtime >= wall - 1]
        status = "ok" if rc == 0 else "failed"
        outcomes.append(Outcome(e, status, seconds, detail, written))
        out(f"{head}: {status} in {clock(seconds)}" + (f" ({detail})" if detail else ""))
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> str:
    lines = ["| entry | status | time | result files written |", "| --- | --- | ---: | --- |"]
    for o in outcomes:
        status = o.status + (f" ({o.detail})" if o.detail else "")
        written = ", ".join(o.written) or "-"
        lines.append(f"| {o.entry.name} | {status} | {clock(o.seconds) if o.seconds else '-'} | {written} |")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "skipped")}
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items())]
    return "\n".join(lines)


def subprocess_runner(e: Entry) -> int:
    """Run ``e``'s command in this interpreter from the repository root, its output shown as it comes."""
    return subprocess.run([sys.executable, *e.command], cwd=ROOT, env=dict(os.environ)).returncode


def main(argv: Sequence[str] | None = None, registry: Sequence[Entry] = REGISTRY) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="list the entries (what, command, duration, results)")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run only these entries")
    ap.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="run all but these entries")
    ap.add_argument("--dry-run", action="store_true", help="print the commands that would run; run nothing")
    args = ap.parse_args(argv)
    entries = select(registry, args.only, args.skip)
    if args.list:
        print(listing(entries))
        return 0
    if args.dry_run:
        for i, e in enumerate(entries, 1):
            gpu = "  # needs a CUDA GPU" if e.gpu else ""
            print(f"# [{i}/{len(entries)}] {e.name} ({minutes(e.minutes)}){gpu}\n{e.shell()}")
        return 0
    outcomes = run(entries, subprocess_runner)
    print("\n" + summary(outcomes))
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
