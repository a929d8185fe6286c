"""Real decode engines in this process, driven by ShareGPT requests: the decode benchmarks' test bench.

Workload (``load_jobs``): pairs from the length predictor's *test* split (never
trained on): the prompt's last ``max_prompt`` tokens, and the true answer length
in the tiny model's tokens, capped at ``max_out``. Each request carries two
estimates: the trained predictor's, served exactly as in the cluster (padded
estimate, bucket range), and the oracle's (the true length). Requests run with
``ignore_eos`` and ``max_tokens`` = the true length, so each generates exactly
that; the policies see the declared cap ``max_out`` instead (``BenchScheduler``),
as the decode worker's scheduler does in the cluster, so the true length never
leaks into a decision.

Engines: vLLM ``LLMEngine`` in this process, the tiny model, 1 thread,
``TetriDecodeScheduler`` and a KV cache of ``num_blocks`` blocks. Without a
prefill worker in front, each engine prefills its prompts itself, so a job's time
includes that (short) prefill.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_results import RESULTS, provenance, run_facts  # noqa: E402, F401  (RESULTS: the decode benchmarks' --out)

from tetriserve.common.config import EngineConfig  # noqa: E402
from tetriserve.engine.settings import engine_env  # noqa: E402

os.environ.update(engine_env(EngineConfig(threads_per_engine=1)))  # in-process engines; before vllm is imported

from tetriserve.common.length import LengthEstimate  # noqa: E402
from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler  # noqa: E402

BLOCK = 32
DECLARED_KEY = "bench_max_tokens"


class BenchScheduler(TetriDecodeScheduler):
    """The decode scheduler, shown the declared cap rather than the engine's ``max_tokens`` (the true length)."""

    def _view(self, req: Any, in_flight: Any = frozenset()) -> Any:
        view = super()._view(req, in_flight)
        declared = (req.sampling_params.extra_args or {}).get(DECLARED_KEY)
        return replace(view, max_tokens=int(declared)) if declared else view


@dataclass(frozen=True)
class Job:
    rid: str
    prompt: tuple[int, ...]
    truth: int
    estimates: dict[str, LengthEstimate]  # "trained" | "oracle"
    tbt_slo_s: float | None = None


def load_jobs(
    n: int, seed: int, model_path: str, max_prompt: int = 256, max_out: int = 512, min_out: int = 8
) -> list[Job]:
    from transformers import AutoTokenizer

    from tetriserve.common.length import PredictInput
    from tetriserve.common.prefill_config import PrefillConfig
    from tetriserve.length_predictor.commands import DataOptions, load_pairs
    from tetriserve.length_predictor.factory import build_predictor

    tok = AutoTokenizer.from_pretrained(model_path)
    pairs = [p for p in load_pairs(DataOptions(model_path), progress=False) if p.split == "test"]
    pairs = [p for p in pairs if p.response_len >= min_out]
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:n]
    prompts = [tuple(tok.encode(p.prompt, add_special_tokens=True)[-max_prompt:]) for p in pairs]
    predictor = build_predictor(PrefillConfig(predictor="trained"), model_path)
    trained = predictor.predict([PredictInput(len(pr), max_out, pr) for pr in prompts])
    jobs = []
    for i, (p, pr, est) in enumerate(zip(pairs, prompts, trained, strict=True)):
        truth = min(p.response_len, max_out)
        oracle = LengthEstimate(truth, truth, truth + 1, -1, 1.0, "oracle")
        jobs.append(Job(f"j{i}", pr, truth, {"trained": est, "oracle": oracle}))
    return jobs


def make_engine(model_path: str, num_blocks: int, connector: str | None = None) -> Any:
    """A decode engine; ``connector`` names its KV connector endpoint (needed to swap), None for none."""
    from vllm.v1.engine.llm_engine import LLMEngine

    from tetriserve.engine.settings import EngineRole, build_engine_args

    max_len = min(1024, (num_blocks - 1) * BLOCK)  # vLLM keeps one block aside and wants room for a longest request
    cfg = EngineConfig(dtype="float32", max_model_len=max_len, enforce_eager=True, kv_cache_gb=0.05, block_size=BLOCK)
    role = EngineRole.DECODE if connector else EngineRole.COLOCATED
    args = build_engine_args(
        cfg,
        model_path,
        role,
        endpoint=connector or "",
        transport="tcp",
        chunk_size=1024,
        scheduler_cls="benchmarks.decode_harness.BenchScheduler",
    )
    args.num_gpu_blocks_override = num_blocks
    args.enable_prefix_caching = False  # each request's KV is its own, as on a decode worker
    return LLMEngine.from_engine_args(args)


def scheduler(engine: Any) -> TetriDecodeScheduler:
    sched = engine.engine_core.engine_core.scheduler
    assert isinstance(sched, TetriDecodeScheduler)
    return sched


def add(engine: Any, job: Job, source: str, tag: str, max_out: int) -> str:
    from vllm import SamplingParams

    from tetriserve.common.engine_tags import EngineTags

    tags = EngineTags(estimate=job.estimates[source], tbt_slo_s=job.tbt_slo_s)
    extra: dict[str, Any] = {**tags.extra(), DECLARED_KEY: max_out}
    params = SamplingParams(max_tokens=job.truth, ignore_eos=True, temperature=0.0, extra_args=extra)
    rid = f"{tag}:{job.rid}"
    engine.add_request(rid, {"prompt_token_ids": list(job.prompt)}, params)
    return rid


@dataclass
class EngineRun:
    """One engine's part of a run: when each of its jobs finished, and how long it was busy stepping."""

    finished_s: dict[str, float] = field(default_factory=dict)  # job id -> seconds from the run's start
    busy_s: float = 0.0
    steps: int = 0

    def step(self, engine: Any, start: float) -> None:
        t0 = time.perf_counter()
        outs = engine.step()
        t1 = time.perf_counter()
        self.busy_s += t1 - t0
        self.steps += 1
        for o in outs:
            if o.finished:
                self.finished_s[o.request_id.split(":", 1)[1]] = t1 - start


@dataclass(frozen=True)
class BurstResult:
    jct_s: list[float]
    wall_s: float
    preemptions: int
    swapped: int
    preemption_s: list[float]


def run_burst(engine: Any, jobs: Sequence[Job], source: str, tag: str, max_out: int) -> BurstResult:
    """Add every job at once and step until all finish; JCT = finish − start (same start for all)."""
    sched = scheduler(engine)
    before = (sched.stats.count, sched.stats.swapped, len(sched.stats.durations_s))
    start = time.perf_counter()
    for job in jobs:
        add(engine, job, source, tag, max_out)
    run = EngineRun()
    while engine.has_unfinished_requests():
        run.step(engine, start)
    wall = time.perf_counter() - start
    assert len(run.finished_s) == len(jobs), "every job must finish"
    return BurstResult(
        sorted(run.finished_s.values()),
        wall,
        sched.stats.count - before[0],
        sched.stats.swapped - before[1],
        sched.stats.durations_s[before[2] :],
    )


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def workload_args(ap: Any, **defaults: int) -> None:
    """The options every decode benchmark shares (the workload), with per-benchmark defaults."""
    ap.add_argument("--blocks", type=int, default=defaults.get("blocks", 64), help="KV blocks per engine")
    ap.add_argument("--max-prompt", type=int, default=128)
    ap.add_argument("--max-out", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)


def bench_header() -> tuple[str, dict[str, Any]]:
    """The tiny model's path (built once) and the facts every result file starts with (``run_facts``)."""
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    facts = run_facts()
    return str(build_tiny_model(default_tiny_model_dir())), facts


def header_lines(facts: dict[str, Any]) -> list[str]:
    """A report's lines after its title: the run's command, machine, commit and date (``provenance``)."""
    return provenance(facts)


def write_results(out: Path, res: dict[str, Any], markdown: str) -> None:
    """``out``.json (everything measured) and ``out``.md (the report, also printed)."""
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
