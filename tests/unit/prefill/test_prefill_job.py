"""A request's life on a prefill worker as its state machine (``prefill_worker/lifecycle.py``) and as the worker
drives it (``PrefillWorker._drive``), with the engine, the predictor and the handoff faked (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.prefill.decodes import decode_load, directory
from tetriserve.common.config import ClusterConfig
from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.stream import FinishReason
from tetriserve.engine.loop_messages import Delta
from tetriserve.prefill_worker.admission import SchedBatchGate
from tetriserve.prefill_worker.handoff import Handed, NotHanded
from tetriserve.prefill_worker.lifecycle import IllegalTransition, Phase, PrefillJob, view_of
from tetriserve.prefill_worker.offload import Offloader
from tetriserve.prefill_worker.pace import PrefillPace
from tetriserve.prefill_worker.policy import PrefillPolicySpec
from tetriserve.prefill_worker.predictions import PredictionQueue, Ticket
from tetriserve.prefill_worker.queue.fcfs import FCFS
from tetriserve.prefill_worker.views import ReqView
from tetriserve.prefill_worker.worker import PrefillWorker

ESTIMATE = LengthEstimate(0, 10, 100, source="instant")


def test_a_job_moves_only_along_the_machine_s_edges_and_ends_once() -> None:
    job = PrefillJob(Request("r", (1, 2, 3), SamplingSpec(max_tokens=8)), "fd", view_of(Request("r", (1, 2, 3))))
    with pytest.raises(IllegalTransition):
        job.advance(Phase.HANDED)  # a queued request has no KV to hand over
    job.advance(Phase.COMPUTING)
    job.advance(Phase.PARKED)
    with pytest.raises(IllegalTransition):
        job.advance(Phase.OFFLOADED)  # computed here: a decode worker no longer computes it
    job.advance(Phase.HANDED)
    job.end(Phase.FAILED)  # ended already: an abort arriving late changes nothing
    assert job.history == [Phase.QUEUED, Phase.COMPUTING, Phase.PARKED, Phase.HANDED] and job.done


def test_the_view_of_a_migrated_request_counts_the_tokens_the_client_has_and_what_is_left() -> None:
    req = Request("r", (1, 2, 3), SamplingSpec(max_tokens=8), resume=(7, 8))
    view = view_of(req)
    assert (view.prompt_len, view.max_tokens, view.offloadable) == (5, 6, True)
    assert not view_of(Request("r", (1, 2, 3), SamplingSpec(max_tokens=1))).offloadable  # ends at prefill
    seeded = SamplingSpec(max_tokens=8, seed=1, temperature=0.7)
    assert not view_of(Request("r", (1, 2, 3), seeded)).offloadable  # its draws belong to one engine


class _Instant:
    """The predictor's instant estimate: 5 tokens, whatever the prompt."""

    def instant(self, item: PredictInput) -> LengthEstimate:
        return LengthEstimate(4, 5, 6, source="instant")


class _Predictions:
    predictor = _Instant()

    def submit(self, item: PredictInput) -> Ticket:
        loop = asyncio.get_running_loop()
        return Ticket(item, loop, loop.create_future())

    def withdraw(self, ticket: Ticket) -> None:
        ticket.future.cancel()

    within = staticmethod(PredictionQueue.within)

    async def estimate(self, ticket: Ticket, wait_s: float = 0.0) -> tuple[LengthEstimate, None]:
        return ESTIMATE, None


class _Endpoint:
    def __init__(self) -> None:
        self.discarded: list[str] = []

    def discard(self, key: str) -> bool:
        self.discarded.append(key)
        return True


class _Offer:
    def __init__(self, taken: bool) -> None:
        self.taken, self.asked = taken, []

    async def __call__(self, job: PrefillJob, decode_id: str) -> object:
        assert job.req.length_estimate is not None  # the estimate goes with the request
        self.asked.append(decode_id)
        return _Peer() if self.taken else None


class _Peer:
    handle = "decode-handle"


@dataclass
class _Shell:
    """A prefill worker with its engine, predictor and handoff faked; what it streamed and forwarded."""

    worker: PrefillWorker
    published: list[tuple[str, tuple[int, ...], FinishReason | None, dict[str, Any]]] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    engine_views: list[ReqView] = field(default_factory=list)  # the views the engine ran requests with
    engine_out: Delta = field(default_factory=lambda: Delta((42,), None, None, None))
    engine_holds: asyncio.Event | None = None
    handoff_result: Handed | NotHanded | None = None
    handoff_holds: asyncio.Event | None = None


def _shell(offer_taken: bool = False, offload_max_tokens: int = 0) -> _Shell:
    worker = PrefillWorker.__new__(PrefillWorker)
    shell = _Shell(worker)
    worker.worker_id = "prefill-0"
    worker.config = ClusterConfig(prefill={"offload_wait_s": 1.0}, transport={"pipeline": False})
    worker.gate = SchedBatchGate(FCFS(), 1)
    worker.pace = PrefillPace()
    worker.directory = directory([decode_load("decode-1", 2)])
    spec = PrefillPolicySpec(chunk_size=512, offload_max_tokens=offload_max_tokens)
    worker.offloader = Offloader("prefill-0", worker.gate, worker.pace, worker.directory, None, spec, 1.0)
    worker.offloader.take = _Offer(offer_taken)  # type: ignore[method-assign]
    worker.predictions = _Predictions()  # type: ignore[assignment]
    worker.endpoint = _Endpoint()  # type: ignore[assignment]
    worker.engine = type("E", (), {"abort": staticmethod(lambda key: None)})()
    worker._jobs, worker.handoffs = {}, {"pipelined": 0, "whole": 0, "offloaded": 0}
    worker.publish = lambda sub, req, tokens, reason=None, error=None, **kw: shell.published.append(  # type: ignore
        (sub, tokens, reason, {"error": error, **kw})
    )
    worker.event = lambda *args, **kwargs: None  # type: ignore[method-assign]
    worker.handed_on = lambda rid, handle: None  # type: ignore[method-assign]
    worker.forward_abort = lambda rid, attempt=None: shell.forwarded.append(rid) or True  # type: ignore

    async def run_engine(req: Request, view: ReqView, park: bool) -> Delta:
        shell.computed.append(req.request_id)
        shell.engine_views.append(view)
        if shell.engine_holds is not None:
            await shell.engine_holds.wait()
        return shell.engine_out

    async def run_handoff(job: PrefillJob, generated: tuple[int, ...], chosen: object) -> Handed | NotHanded:
        if shell.handoff_holds is not None:
            await shell.handoff_holds.wait()
        if job.abort_requested:
            return NotHanded(None)
        assert shell.handoff_result is not None
        return shell.handoff_result

    worker._run_engine = run_engine  # type: ignore[method-assign]
    worker.handoff = type("H", (), {"run": staticmethod(run_handoff)})()  # type: ignore[assignment]
    return shell


def _run(shell: _Shell, req: Request, step: Any = None) -> PrefillJob:
    """Submit ``req``; ``step(shell, job)`` runs once it has gone as far as it goes without help."""

    async def scenario() -> PrefillJob:
        shell.worker.submit(req, "fd")
        job = shell.worker._jobs[req.request_id]
        for _ in range(10):
            await asyncio.sleep(0)
        if step is not None:
            step(shell, job)
            for _ in range(10):
                await asyncio.sleep(0)
        assert job.task is not None and job.task.done() and job.task.exception() is None
        assert req.request_id not in shell.worker._jobs  # its task ended: the worker holds it no longer
        return job

    return asyncio.run(scenario())


REQ = Request("r", tuple(range(1, 21)), SamplingSpec(max_tokens=16))


def test_a_request_handed_on_goes_queued_computing_parked_handed_and_its_stream_moves_there() -> None:
    shell = _shell()
    shell.handoff_result = Handed("decode-1", _Peer(), pipelined=False)  # type: ignore[arg-type]
    job = _run(shell, REQ)
    assert job.history == [Phase.QUEUED, Phase.COMPUTING, Phase.PARKED, Phase.HANDED]
    assert [(tokens, p[3].get("moved_to")) for p in shell.published for tokens in [p[1]]] == [
        ((42,), None),  # the first token, at once
        ((), "decode-1"),  # then the stream goes on from the decode worker
    ]
    assert shell.worker.handoffs["whole"] == 1


def test_a_failed_handoff_ends_the_attempt_with_a_retry_error_and_a_short_prompt_a_decode_worker_takes_never_computes(
) -> None:
    shell = _shell()
    shell.handoff_result = NotHanded("decode worker decode-1 refused the request")
    job = _run(shell, REQ)
    assert job.phase is Phase.FAILED
    _, _, reason, extra = shell.published[-1]
    assert reason is FinishReason.ERROR and extra["retry"] and "refused" in extra["error"]

    shell = _shell(offer_taken=True, offload_max_tokens=64)
    job = _run(shell, REQ)
    assert job.history == [Phase.QUEUED, Phase.OFFLOADED] and not shell.computed
    assert shell.published[-1][3]["moved_to"] == "decode-1" and shell.worker.handoffs["offloaded"] == 1


def test_a_short_prompt_the_decode_worker_refuses_is_computed_here_offered_once() -> None:
    shell = _shell(offer_taken=False, offload_max_tokens=64)
    shell.handoff_result = Handed("decode-1", _Peer(), pipelined=False)  # type: ignore[arg-type]
    job = _run(shell, REQ)
    assert shell.worker.offloader.take.asked == ["decode-1"]  # type: ignore[attr-defined]
    assert shell.computed == ["r"] and job.phase is Phase.HANDED


def test_a_request_that_ends_at_its_first_token_finishes_here_and_its_kv_goes() -> None:
    shell = _shell()
    shell.engine_out = Delta((42,), "stop", None, None)
    job = _run(shell, REQ)
    assert job.history == [Phase.QUEUED, Phase.COMPUTING, Phase.FINISHED]
    assert shell.published[-1][2] is FinishReason.STOP and shell.worker.endpoint.discarded == [REQ.kv_key]  # type: ignore[attr-defined]


def test_an_abort_is_honoured_in_the_queue_in_the_handoff_and_after_it() -> None:
    shell = _shell()
    shell.engine_holds = asyncio.Event()  # the first in line holds the engine
    holder = Request("h", (1, 2), SamplingSpec(max_tokens=16), arrival_time=REQ.arrival_time - 1)

    async def queued() -> PrefillJob:
        shell.worker.submit(holder, "fd")
        shell.worker.submit(REQ, "fd")
        job = shell.worker._jobs["r"]
        for _ in range(10):
            await asyncio.sleep(0)
        assert job.phase is Phase.QUEUED
        assert shell.worker.abort("r")
        for _ in range(10):
            await asyncio.sleep(0)
        shell.worker._jobs["h"].task.cancel()  # type: ignore[union-attr]
        return job

    job = asyncio.run(queued())
    assert job.history == [Phase.QUEUED, Phase.ABORTED] and shell.published[-1][2] is FinishReason.ABORT

    shell = _shell()
    shell.handoff_holds = asyncio.Event()

    def abort_while_parked(shell: _Shell, job: PrefillJob) -> None:
        assert job.phase is Phase.PARKED
        shell.worker.abort("r")
        assert shell.handoff_holds is not None
        shell.handoff_holds.set()

    job = _run(shell, REQ, abort_while_parked)
    assert job.phase is Phase.ABORTED and shell.published[-1][2] is FinishReason.ABORT and not shell.forwarded

    shell = _shell()
    shell.handoff_result = Handed("decode-1", _Peer(), pipelined=False)  # type: ignore[arg-type]
    job = _run(shell, REQ)
    assert shell.worker.abort("r", REQ.attempt) and shell.forwarded == ["r"]  # handed on: the abort follows it


def test_the_view_carries_the_instant_estimate_and_a_prediction_out_during_prefill_retags_the_engine() -> None:
    # AccelGen §4.3's S_g: the instant estimate (4, 5, 6) on the view the engine runs the request with, less the
    # 2 tokens a migrated request's client has: (2, 3, 4); the prediction (10, 20, 30) that comes while the prompt
    # is computed goes to the engine's tags as (8, 18, 28)
    shell = _shell()
    shell.handoff_result = Handed("decode-1", _Peer(), pipelined=False)  # type: ignore[arg-type]
    shell.engine_holds = asyncio.Event()
    retagged: list[tuple[str, LengthEstimate]] = []

    class _Sched:
        def retag(self, key: str, estimate: LengthEstimate) -> bool:
            retagged.append((key, estimate))
            return True

    async def call(fn: Any) -> Any:
        return fn(_Sched())

    shell.worker.engine.call = call  # type: ignore[attr-defined]
    migrated = Request("m", tuple(range(1, 21)), SamplingSpec(max_tokens=16), resume=(7, 8))

    def prediction_out(shell: _Shell, job: PrefillJob) -> None:
        assert job.phase is Phase.COMPUTING and job.ticket is not None
        job.ticket.future.set_result(LengthEstimate(10, 20, 30))
        assert shell.engine_holds is not None
        asyncio.get_running_loop().call_later(0.01, shell.engine_holds.set)

    async def scenario() -> None:
        shell.worker.submit(migrated, "fd")
        job = shell.worker._jobs["m"]
        for _ in range(10):
            await asyncio.sleep(0)
        prediction_out(shell, job)
        assert job.task is not None
        await job.task

    asyncio.run(scenario())
    estimate = shell.engine_views[0].estimate
    assert estimate is not None and (estimate.lower, estimate.estimate, estimate.upper) == (2, 3, 4)
    assert [(k, (e.lower, e.estimate, e.upper)) for k, e in retagged] == [(migrated.kv_key, (8, 18, 28))]


def _waiting_shell(wait_ms: float) -> _Shell:
    shell = _shell()
    shell.worker.config = ClusterConfig(
        prefill={"offload_wait_s": 1.0, "predictor_queue_wait_ms": wait_ms}, transport={"pipeline": False}
    )
    shell.handoff_result = Handed("decode-1", _Peer(), pipelined=False)  # type: ignore[arg-type]
    return shell


def test_with_a_queue_wait_a_request_queues_on_its_prediction_once_it_is_out() -> None:
    # predictor_queue_wait_ms 10 s: the request waits for its prediction (10, 20, 30), out after 10 ms, and the
    # engine runs it with that, not the instant (4, 5, 6)
    shell = _waiting_shell(10_000)

    async def scenario() -> None:
        shell.worker.submit(REQ, "fd")
        job = shell.worker._jobs["r"]
        for _ in range(10):
            await asyncio.sleep(0)
        assert not shell.computed and job.phase is Phase.QUEUED  # waiting for its prediction, not in the queue
        assert job.ticket is not None
        ticket = job.ticket
        asyncio.get_running_loop().call_later(0.01, lambda: ticket.future.set_result(LengthEstimate(10, 20, 30)))
        assert job.task is not None
        await job.task

    asyncio.run(scenario())
    estimate = shell.engine_views[0].estimate
    assert estimate is not None and (estimate.lower, estimate.estimate, estimate.upper) == (10, 20, 30)


def test_past_the_queue_wait_a_request_queues_on_the_instant_estimate() -> None:
    # predictor_queue_wait_ms 20: no prediction comes, so after 20 ms the engine runs it with the instant (4, 5, 6)
    shell = _waiting_shell(20)

    async def scenario() -> float:
        start = asyncio.get_running_loop().time()
        shell.worker.submit(REQ, "fd")
        task = shell.worker._jobs["r"].task
        assert task is not None
        await task
        return asyncio.get_running_loop().time() - start

    assert asyncio.run(scenario()) >= 0.02
    estimate = shell.engine_views[0].estimate
    assert estimate is not None and (estimate.lower, estimate.estimate, estimate.upper) == (4, 5, 6)


def test_an_abort_ends_a_wait_for_the_prediction_at_once() -> None:
    shell = _waiting_shell(60_000)  # a minute's wait, ended by the abort

    def abort(shell: _Shell, job: PrefillJob) -> None:
        assert job.phase is Phase.QUEUED and not shell.computed
        assert shell.worker.abort("r")

    job = _run(shell, REQ, abort)
    assert job.history == [Phase.QUEUED, Phase.ABORTED] and shell.published[-1][2] is FinishReason.ABORT
    assert not shell.computed
