"""Time profile scenarios on one in-process vLLM engine (SOLA §5.2 offline profiling; AccelGen §4.2 sweep).

    engine_env (threads, in-process) ─▶ LLMEngine(COLOCATED, max_num_batched_tokens ≥ max forward)
    warm-up, untimed: every sweep size, one chunked and one decode scenario
    repeats × rounds over all scenarios:
        scheduler.max_num_scheduled_tokens ← scenario budget   (the chunk size c; the knob
                                                               prefill_worker.vllm_scheduler turns too)
        add its prompts: random ids < vocab, fixed seed, a serial number in the first two ids (no prefix hits)
        while unfinished: t0 = perf_counter(); engine.step(); t = perf_counter() − t0
        the step's SchedulerOutput must equal engine.profile_plan's FCFS derivation, piece by piece
    each iteration: the median over rounds and their spread ─▶ MeasuredStep ─▶ engine.profile_fit

The environment (``engine_env``) must be set before ``vllm`` is first imported: ``ProfileEngine.open`` does it.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tetriserve.common.config import EngineConfig
from tetriserve.common.scls_estimators import kv_bytes_per_token
from tetriserve.engine.profile_fit import MeasuredStep
from tetriserve.engine.profile_plan import (
    Scenario,
    ScenarioKind,
    Step,
    chunked_scenarios,
    decode_scenarios,
    simulate_fcfs,
    sweep_scenarios,
)
from tetriserve.engine.settings import EngineRole, build_engine_args, engine_env
from tetriserve.engine.vllm_engine import InProcessEngine, open_engine

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput


@dataclass(frozen=True)
class EngineFacts:
    dtype: str  # as vLLM resolved it (``auto`` on CPU may pick bfloat16)
    max_model_len: int
    max_batched_tokens: int
    max_num_seqs: int
    kv_capacity_tokens: int
    vocab_size: int
    kv_bytes_per_token: int = 0  # SCLS §4.3 Δ: K and V of every layer, at the model's dtype


class ProfileEngine:
    """One LLMEngine plus a tap on its scheduler: runs a scenario, checks each iteration, returns step times."""

    def __init__(self, engine: InProcessEngine, seed: int = 0) -> None:
        import numpy as np

        self.engine = engine
        try:
            self.scheduler = engine.engine_core.engine_core.scheduler
        except AttributeError as exc:
            raise RuntimeError("profile needs an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)") from exc
        self._outputs: list[SchedulerOutput] = []
        schedule = self.scheduler.schedule

        def tap(*args: bool, **kwargs: bool) -> SchedulerOutput:
            out = schedule(*args, **kwargs)
            self._outputs.append(out)
            return out

        self.scheduler.schedule = tap  # type: ignore[method-assign]  # the tap on this scheduler's iterations
        vcfg = engine.vllm_config
        blocks = vcfg.cache_config.num_gpu_blocks
        if blocks is None:  # vLLM sizes the KV cache while it builds the engine
            raise TypeError("the engine's KV cache has no size (num_gpu_blocks is None)")
        self.facts = EngineFacts(
            dtype=str(vcfg.model_config.dtype).removeprefix("torch."),
            max_model_len=int(vcfg.model_config.max_model_len),
            max_batched_tokens=int(vcfg.scheduler_config.max_num_batched_tokens),
            max_num_seqs=int(self.scheduler.max_num_running_reqs),
            kv_capacity_tokens=int(blocks) * int(vcfg.cache_config.block_size),
            vocab_size=int(vcfg.model_config.get_vocab_size()),
            kv_bytes_per_token=_kv_bytes_per_token(vcfg),
        )
        self._rng = np.random.default_rng(seed)
        self._serial = 0

    @classmethod
    def open(cls, cfg: EngineConfig, model: str, max_forward: int, seed: int = 0) -> ProfileEngine:
        os.environ.update(engine_env(cfg))
        import torch

        torch.set_num_threads(cfg.threads_per_engine)
        args = build_engine_args(cfg, model, EngineRole.COLOCATED, chunk_size=max_forward)
        return cls(open_engine(args), seed)

    def _prompt(self, length: int) -> list[int]:
        vocab = self.facts.vocab_size
        ids: list[int] = self._rng.integers(0, vocab, size=length).tolist()
        ids[0] = self._serial % vocab
        if length > 1:
            ids[1] = (self._serial // vocab) % vocab
        self._serial += 1
        return ids

    def run(self, sc: Scenario, plan: Sequence[Step]) -> list[float]:
        """Run ``sc`` once from idle; every iteration must match ``plan``. Returns each iteration's seconds."""
        from vllm import SamplingParams

        if sc.budget > self.facts.max_batched_tokens:
            raise ValueError(f"scenario {sc.name}: budget {sc.budget} > max_num_batched_tokens")
        if self.engine.has_unfinished_requests():
            raise RuntimeError(f"scenario {sc.name}: the engine is not idle")
        self.scheduler.max_num_scheduled_tokens = sc.budget
        index: dict[str, int] = {}
        for i, (n, m) in enumerate(zip(sc.prompt_lens, sc.max_tokens, strict=True)):
            params = SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0)
            rid = self.engine.add_request(f"{sc.name}.{self._serial}", {"prompt_token_ids": self._prompt(n)}, params)
            index[rid] = i
        gc.collect()
        times: list[float] = []
        while self.engine.has_unfinished_requests():
            self._outputs.clear()
            t0 = time.perf_counter()
            self.engine.step()
            dt = time.perf_counter() - t0
            outs = [o for o in self._outputs if o.total_num_scheduled_tokens > 0]
            if len(outs) > 1:
                raise RuntimeError(f"scenario {sc.name}: one engine.step() ran {len(outs)} iterations")
            if outs:
                self._check(sc, plan, len(times), outs[0], index)
                times.append(dt)
        if len(times) != len(plan):
            raise RuntimeError(f"scenario {sc.name}: {len(times)} iterations ran, the FCFS derivation has {len(plan)}")
        return times

    @staticmethod
    def _check(sc: Scenario, plan: Sequence[Step], i: int, out: SchedulerOutput, index: dict[str, int]) -> None:
        has = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        has.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        seen = sorted((index[r], has[r], n) for r, n in out.num_scheduled_tokens.items())
        want = sorted((p.request, p.has, p.new) for p in plan[i]) if i < len(plan) else []
        if seen != want:
            raise RuntimeError(
                f"scenario {sc.name} iteration {i}: vLLM scheduled (request, l_has, l_in) {seen}, "
                f"the FCFS derivation says {want}"
            )


def _kv_bytes_per_token(vcfg: VllmConfig) -> int:
    import torch

    mc, pc = vcfg.model_config, vcfg.parallel_config
    if not isinstance(mc.dtype, torch.dtype):  # vLLM resolves it while it builds the engine
        raise TypeError(f"the engine's model dtype is unresolved ({mc.dtype!r})")
    itemsize = torch.empty((), dtype=mc.dtype).element_size()
    return kv_bytes_per_token(mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size(), itemsize)


def plan_scenarios(facts: EngineFacts, max_forward: int) -> list[Scenario]:
    """Sweep sizes up to ``max_forward`` (a prompt needs one slot for its output token), chunked and decode sets."""
    top = min(max_forward, facts.max_batched_tokens, facts.max_model_len - 1)
    return [
        *sweep_scenarios(top),
        *chunked_scenarios(min(max_forward, facts.max_batched_tokens), facts.max_model_len - 1),
        *decode_scenarios(facts.max_model_len, facts.max_batched_tokens, facts.max_num_seqs, facts.kv_capacity_tokens),
    ]


def measure(
    engine: ProfileEngine, scenarios: Sequence[Scenario], repeats: int, progress: bool = True
) -> list[MeasuredStep]:
    """Warm up (the sweep and one scenario of each other kind), then ``repeats`` rounds over all scenarios
    (rounds, not back-to-back repeats, so a burst of machine noise does not land on one scenario only);
    each iteration keeps the median over rounds and the rounds' spread around it."""
    from tqdm import tqdm

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    plans = {
        sc.name: simulate_fcfs(sc.prompt_lens, sc.max_tokens, sc.budget, engine.facts.max_num_seqs) for sc in scenarios
    }
    warm = [sc for sc in scenarios if sc.kind is ScenarioKind.SWEEP]
    for kind in (ScenarioKind.CHUNKED, ScenarioKind.DECODE):
        warm += [sc for sc in scenarios if sc.kind is kind][:1]
    runs: dict[str, list[list[float]]] = {sc.name: [] for sc in scenarios}
    with tqdm(total=len(warm) + repeats * len(scenarios), desc="profile", unit="run", disable=not progress) as bar:
        for sc in warm:
            bar.set_postfix_str(f"warm-up {sc.name}")
            engine.run(sc, plans[sc.name])
            bar.update()
        for r in range(repeats):
            for sc in scenarios:
                bar.set_postfix_str(f"round {r + 1}/{repeats} {sc.name}")
                runs[sc.name].append(engine.run(sc, plans[sc.name]))
                bar.update()
    out: list[MeasuredStep] = []
    for sc in scenarios:
        for i, step in enumerate(plans[sc.name]):
            times = [run[i] for run in runs[sc.name]]
            median = statistics.median(times)
            spread = statistics.fmean(abs(t - median) for t in times) / median if len(times) > 1 else float("nan")
            out.append(MeasuredStep(sc.name, sc.kind, len(sc.prompt_lens), i, step, median, spread))
    return out
