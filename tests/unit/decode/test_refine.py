"""A prediction that came after the handoff reaches the decode worker's policies (no Ray, no engine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tetriserve.common.config import ClusterConfig
from tetriserve.common.engine_tags import TAGS_KEY, EngineTags, tags_of
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request

INSTANT = LengthEstimate(0, 20, 100, source="instant")
MODEL = LengthEstimate(150, 300, 400, source="model")


def _engine_request(rid: str, estimate: LengthEstimate) -> Any:
    params = SimpleNamespace(extra_args=EngineTags(request_id=rid, estimate=estimate).extra())
    return SimpleNamespace(request_id=f"{rid}-0a1b", sampling_params=params)


class _Engine:
    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    async def call(self, fn: Any) -> Any:
        return fn(self.scheduler)


def _worker() -> tuple[Any, Any]:
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler
    from tetriserve.decode_worker.worker import DecodeWorker, Running

    scheduler = SimpleNamespace(requests={"r1-0a1b": _engine_request("r1", INSTANT)})
    scheduler.retag = lambda rid, est: TetriDecodeScheduler.retag(scheduler, rid, est)  # type: ignore[arg-type]
    worker = DecodeWorker.__new__(DecodeWorker)  # no engine: just what ``refine`` needs
    worker.config = ClusterConfig()
    worker.engine = _Engine(scheduler)
    run = Running(Request("r1", (1, 2), attempt=1, length_estimate=INSTANT), "fd", False, [7], base=1)
    worker.running = {"r1": run}
    return worker, scheduler


def test_a_late_prediction_replaces_the_instant_estimate_in_the_worker_and_the_engine_scheduler() -> None:
    worker, scheduler = _worker()
    assert asyncio.run(worker.refine("r1", 1, MODEL))
    run = worker.running["r1"]
    assert run.estimate == MODEL and run.heavy  # 300 tokens: a heavy decode now
    assert run.request.length_estimate == MODEL  # the estimate lives on the request
    tags = tags_of(scheduler.requests["r1-0a1b"].sampling_params.extra_args)
    assert tags.estimate == MODEL.after(0) and tags.request_id == "r1"
    assert isinstance(scheduler.requests["r1-0a1b"].sampling_params.extra_args[TAGS_KEY], EngineTags)


def test_a_prediction_for_another_attempt_or_a_request_gone_changes_nothing() -> None:
    worker, scheduler = _worker()
    assert not asyncio.run(worker.refine("r1", 0, MODEL))
    assert not asyncio.run(worker.refine("gone", 1, MODEL))
    assert worker.running["r1"].estimate == INSTANT
    assert tags_of(scheduler.requests["r1-0a1b"].sampling_params.extra_args).estimate == INSTANT


def test_the_snapshots_remaining_tokens_add_up_what_each_requests_view_predicts() -> None:
    """The engine thread sums the predicted remaining tokens of every request without building views; the sum
    is what the views would give: the point estimate less what was generated, capped by ``max_tokens``, all of
    ``max_tokens`` without an estimate, never below 0."""
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler

    def req(rid: str, estimate: LengthEstimate | None, max_tokens: int | None, generated: int) -> Any:
        extra = EngineTags(request_id=rid, estimate=estimate).extra() if estimate is not None else None
        params = SimpleNamespace(extra_args=extra, max_tokens=max_tokens)
        out = [1] * generated
        return SimpleNamespace(
            request_id=rid, sampling_params=params, output_token_ids=out, num_output_tokens=generated,
            num_prompt_tokens=5, arrival_time=0.0, num_computed_tokens=5 + generated,
        )  # fmt: skip

    running = [req("a", MODEL, 1000, 10), req("b", MODEL, 100, 20), req("c", None, 64, 4)]
    waiting = [req("d", INSTANT, 50, 0), req("e", MODEL, 1000, 400), req("f", None, None, 0)]
    scheduler = SimpleNamespace(running=running, kv_holding_waiting=waiting[:1], waiting=waiting[1:], block_size=16)
    views = [TetriDecodeScheduler._view(scheduler, r) for r in running + waiting]  # type: ignore[arg-type]
    expected = sum(v.predicted_remaining("estimate") for v in views)
    assert expected == (300 - 10) + (100 - 20) + (64 - 4) + 20 + 0 + 1
    assert TetriDecodeScheduler.remaining_tokens(scheduler) == expected  # type: ignore[arg-type]
