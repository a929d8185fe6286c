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
    run = Running(Request("r1", (1, 2), attempt=1), "fd", False, INSTANT, [7], base=1)
    worker.running = {"r1": run}
    return worker, scheduler


def test_a_late_prediction_replaces_the_instant_estimate_in_the_worker_and_the_engine_scheduler() -> None:
    worker, scheduler = _worker()
    assert asyncio.run(worker.refine("r1", 1, MODEL))
    run = worker.running["r1"]
    assert run.estimate == MODEL and run.heavy  # 300 tokens: a heavy decode now
    tags = tags_of(scheduler.requests["r1-0a1b"].sampling_params.extra_args)
    assert tags.estimate == MODEL.after(0) and tags.request_id == "r1"
    assert isinstance(scheduler.requests["r1-0a1b"].sampling_params.extra_args[TAGS_KEY], EngineTags)


def test_a_prediction_for_another_attempt_or_a_request_gone_changes_nothing() -> None:
    worker, scheduler = _worker()
    assert not asyncio.run(worker.refine("r1", 0, MODEL))
    assert not asyncio.run(worker.refine("gone", 1, MODEL))
    assert worker.running["r1"].estimate == INSTANT
    assert tags_of(scheduler.requests["r1-0a1b"].sampling_params.extra_args).estimate == INSTANT
