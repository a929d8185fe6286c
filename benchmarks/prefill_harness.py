"""One real prefill worker in this process, driven by a scripted workload: the prefill benchmarks' test bench.

The worker is tetriserve's own ``PrefillWorker`` (gate, vLLM engine with the
policy scheduler subclass) without Ray around it; every request has
``max_tokens=1``, so it ends at its first token and needs no decode worker.
Policies are switched between runs with ``PrefillWorker.set_policy`` — the
admin RPC's path — so every policy runs on the same warm engine.

Per request it reports the prefill waiting time (arrival → its first chunk is
scheduled, read from the scheduler's iteration records) and the TTFT (arrival →
first token back at the worker's caller).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_results import RESULTS  # noqa: E402

COST_PROFILE = RESULTS / "cost_profile.json"  # `python benchmarks/cost_profile.py` writes it
SUBSCRIBER = "benchmark"  # the harness reads the worker's stream as a front door would


@dataclass(frozen=True)
class Item:
    prompt: tuple[int, ...]
    offset_s: float  # arrival, relative to the start of the run
    ttft_slo_ms: float | None = None


@dataclass(frozen=True)
class Outcome:
    prompt_len: int
    wait_s: float
    ttft_s: float
    ttft_slo_ms: float | None

    @property
    def met(self) -> bool:
        return self.ttft_slo_ms is None or self.ttft_s * 1000 <= self.ttft_slo_ms


@dataclass(frozen=True)
class RunResult:
    outcomes: list[Outcome]
    iterations: int
    overhead_s: float
    exec_s: float
    fit_error: float | None

    def mean(self, attr: str) -> float:
        return statistics.mean(getattr(o, attr) for o in self.outcomes)

    def attainment(self) -> float:
        return sum(o.met for o in self.outcomes) / len(self.outcomes)

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / (self.overhead_s + self.exec_s) if self.exec_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The run's figures as a result's JSON keeps them: means, attainment, iterations and their times."""
        return {
            "requests": len(self.outcomes),
            "mean_wait_s": self.mean("wait_s"),
            "mean_ttft_s": self.mean("ttft_s"),
            "slo_attainment": self.attainment(),
            "iterations": self.iterations,
            "overhead_s": self.overhead_s,
            "exec_s": self.exec_s,
            "fit_error": self.fit_error,
        }


def bench_overrides(max_batch_tokens: int, cost_profile: str | None, **extra: Any) -> dict[str, Any]:
    """Config for the benchmarks' prefill worker: 2048-token context, room for 128 requests in the engine."""
    return {
        "engine.max_model_len": 2048,
        "engine.max_num_seqs": 128,
        "engine.kv_cache_gb": 2.0,
        "prefill.max_batch_tokens": max_batch_tokens,
        "prefill.cost_profile": cost_profile or None,
        **extra,
    }


def sharegpt_prompts(n: int, seed: int, tokenizer_dir: str, max_len: int) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    from tetriserve.common.sharegpt import sample_prompts

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [tuple(tok.encode(p)[:max_len]) for p in sample_prompts(n, seed)]


class PrefillBench:
    def __init__(self, overrides: dict[str, Any]) -> None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
        from tetriserve.common.config import ClusterConfig
        from tetriserve.engine.settings import engine_env

        self.config = ClusterConfig.load(overrides=overrides)
        os.environ.update(engine_env(self.config.engine))
        from tetriserve.length_predictor.baseline import BucketQuantilePredictor
        from tetriserve.prefill_worker.worker import PrefillWorker

        self.model = str(self.config.engine.model or build_tiny_model(default_tiny_model_dir()))
        self.worker = PrefillWorker("bench-prefill", self.config, self.model, BucketQuantilePredictor())
        self._n = 0

    def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        return asyncio.run(self.worker.set_policy(changes))

    def run(self, items: Sequence[Item]) -> RunResult:
        return asyncio.run(self._run(items))

    def compare(
        self, configs: dict[str, dict[str, Any]], items: Sequence[Item], rounds: int, desc: str
    ) -> dict[str, list[RunResult]]:
        """Every configuration once per round, in an order rotated each round, on this one warm engine."""
        from tqdm import tqdm

        runs: dict[str, list[RunResult]] = {name: [] for name in configs}
        names = list(configs)
        with tqdm(total=rounds * len(names), desc=desc) as bar:
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    self.set_policy(configs[name])
                    runs[name].append(self.run(items))
                    bar.update()
        return runs

    async def _read(self, finished: dict[str, asyncio.Future[Any]]) -> None:
        """The worker's stream to this harness: each request's finishing chunk resolves its future."""
        async for batch in self.worker.streams.subscribe(SUBSCRIBER):
            for chunk in batch:
                fut = finished.get(chunk.request_id)
                if chunk.finished and fut is not None and not fut.done():
                    fut.set_result(chunk)

    async def _one(
        self, item: Item, start: float, rid: str, finished: dict[str, asyncio.Future[Any]]
    ) -> tuple[str, float, float]:
        from tetriserve.common.request import SLO, Request, SamplingSpec

        delay = start + item.offset_s - time.time()
        if item.offset_s > 0 and delay > 0:  # a burst (offset 0) lands in the raw queue in one event-loop tick
            await asyncio.sleep(delay)
        # a first token unique to this run and request: no prefix-cache hits on blocks an earlier run computed
        prompt = (5 + (self._n * 131 + int(rid.rsplit("-", 1)[1])) % 3000, *item.prompt[1:])
        req = Request(rid, prompt, SamplingSpec(max_tokens=1, temperature=0.0), SLO(ttft_ms=item.ttft_slo_ms))
        finished[rid] = asyncio.get_running_loop().create_future()
        self.worker.submit(req, SUBSCRIBER)
        chunk = await finished[rid]
        if chunk.error:
            raise RuntimeError(f"{rid}: {chunk.error}")
        return rid, req.arrival_time, time.time() - req.arrival_time

    async def _run(self, items: Sequence[Item]) -> RunResult:
        log = self.worker.engine.scheduler().log  # read between runs, while the engine is idle
        before = log.stats()
        self._n += 1
        start = time.time()
        ids = [f"r{self._n}-{i}" for i in range(len(items))]
        finished: dict[str, asyncio.Future[Any]] = {}
        reader = asyncio.create_task(self._read(finished))
        try:
            runs = (self._one(it, start, rid, finished) for it, rid in zip(items, ids, strict=True))
            done = await asyncio.gather(*runs)
        finally:
            reader.cancel()
        first: dict[str, float] = {}
        for rec in log.records(since=start - 1):
            for rid, _, _ in rec.chunks:
                first.setdefault(rid, rec.started)
        after = log.stats()
        outcomes = [
            Outcome(len(it.prompt), first[rid] - arrival, ttft, it.ttft_slo_ms)
            for it, (rid, arrival, ttft) in zip(items, done, strict=True)
        ]
        fit = after.fit_error
        return RunResult(
            outcomes,
            after.iterations - before.iterations,
            after.overhead_s - before.overhead_s,
            after.exec_s - before.exec_s,
            fit,
        )
