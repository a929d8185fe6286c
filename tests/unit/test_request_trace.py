"""The request trace: a front door's line per request, for every way a stream can end, and a file that
survives what a disk can do to it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeBackend, tokenizer_dir
from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.common.request import SLO, Request, SamplingSpec
from tetriserve.frontdoor.admission import Overloaded
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.observability.request_trace import RequestTrace


@pytest.fixture()
def traced(tmp_path: Path) -> tuple[FrontDoor, RequestTrace]:
    trace = RequestTrace(tmp_path / "run" / "requests.jsonl")  # its folder is made
    return FrontDoor(FakeBackend(tokenizer_dir()), trace=trace), trace


def _lines(trace: RequestTrace) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace.path.read_text().splitlines()]


def _run(front: FrontDoor, request: Request, take: int | None = None) -> list[Any]:
    async def main() -> list[Any]:
        out = []
        stream = front.admitted_stream(request, started_at=time.monotonic(), route="POST /v1/completions")
        async for d in stream:
            out.append(d)
            if take is not None and len(out) == take:
                await stream.aclose()  # the client leaves
                break
        return out

    return asyncio.run(main())


def test_a_finished_request_s_line_holds_its_inputs_times_and_workers(traced: tuple[FrontDoor, RequestTrace]) -> None:
    front, trace = traced
    before = time.time()
    sampling = SamplingSpec(max_tokens=4, ignore_eos=True, temperature=0.0)
    _run(front, Request("r-1", (5, 6, 7), sampling, slo=SLO(ttft_ms=500, tbt_ms=50), priority=2))
    [line] = _lines(trace)
    assert line["v"] == 1 and line["id"] == "r-1" and line["route"] == "POST /v1/completions"
    assert before - 1 <= line["arrival"] <= time.time()
    assert (line["prompt_tokens"], line["max_tokens"], line["ignore_eos"], line["priority"]) == (3, 4, True, 2)
    assert line["slo"] == {"ttft_ms": 500.0, "tbt_ms": 50.0, "jct_ms": None}
    assert (line["outcome"], line["finish_reason"], line["error"], line["generated"]) == ("finished", "length", None, 4)
    times = [t for t, _ in line["deltas"]]
    assert [n for _, n in line["deltas"]] == [1, 1, 1, 1] and times == sorted(times)
    assert times[0] == line["ttft_ms"] and times[-1] <= line["e2e_ms"]
    assert line["workers"] == ["fake-0"] and line["attempt"] == 0 and line["predicted_output_tokens"] is None
    assert trace.written == 1 and trace.dropped == 0


def test_failed_abandoned_and_refused_requests_have_lines_too(traced: tuple[FrontDoor, RequestTrace]) -> None:
    front, trace = traced
    backend: FakeBackend = front.backend  # type: ignore[assignment]
    backend.behavior.fail_after_tokens = 1  # the stream raises after one token
    with pytest.raises(ConnectionError):
        _run(front, Request("r-lost", (5, 6), SamplingSpec(max_tokens=4)))
    backend.reset()
    backend.behavior.token_delay_s = 0.01
    _run(front, Request("r-gone", (5, 6), SamplingSpec(max_tokens=50)), take=2)
    backend.reset()
    backend.behavior.error_after_tokens = 0  # the backend's own error finish
    _run(front, Request("r-err", (5, 6), SamplingSpec(max_tokens=4)))
    lost, gone, err = _lines(trace)
    assert lost["outcome"] == "failed" and lost["error"].startswith("ConnectionError: ") and lost["generated"] == 1
    assert lost["ttft_ms"] == lost["deltas"][0][0] and lost["e2e_ms"] is None  # its first token came
    assert gone["outcome"] == "abandoned" and gone["generated"] == 2 and len(gone["deltas"]) == 2
    assert err["outcome"] == "finished" and err["finish_reason"] == "error" and "KV transfer" in err["error"]

    full = FrontDoor(FakeBackend(tokenizer_dir()), limits=AdmissionConfig(max_inflight=1), trace=trace)
    full.gate.admit(time.monotonic())  # the one request it may have in flight
    with pytest.raises(Overloaded):
        _run(full, Request("r-shed", (5, 6), SamplingSpec(max_tokens=4)))
    shed = _lines(trace)[-1]
    assert shed["id"] == "r-shed" and shed["outcome"] == "refused" and shed["error"].startswith("Overloaded: ")
    assert shed["generated"] == 0 and shed["deltas"] == [] and shed["prompt_tokens"] == 2


def test_a_write_that_fails_is_counted_never_raised(tmp_path: Path) -> None:
    trace = RequestTrace(tmp_path / "t.jsonl")
    trace.write({"v": 1})
    trace.close()
    trace.write({"v": 1})  # after shutdown's close: dropped, the request is not failed
    assert (trace.written, trace.dropped) == (1, 1)
    assert (tmp_path / "t.jsonl").read_text() == '{"v":1}\n'


def test_a_request_refused_before_it_is_tokenized_has_its_route_and_arrival(tmp_path: Path) -> None:
    trace = RequestTrace(tmp_path / "t.jsonl")
    front = FrontDoor(FakeBackend(tokenizer_dir()), limits=AdmissionConfig(max_inflight=1), trace=trace)
    front.check_admission(time.monotonic(), "POST /v1/chat/completions")  # room: no line
    front.gate.admit(time.monotonic())
    with pytest.raises(Overloaded):
        front.check_admission(time.monotonic(), "POST /v1/chat/completions")
    [line] = _lines(trace)
    assert line["outcome"] == "refused" and line["route"] == "POST /v1/chat/completions" and line["id"] is None
    assert line["prompt_tokens"] is None and line["arrival"] <= time.time() and line["error"].startswith("Overloaded")
    finished = FrontDoor(FakeBackend(tokenizer_dir()), trace=trace)
    _run(finished, Request("r-1", (5, 6), SamplingSpec(max_tokens=1)))
    assert set(_lines(trace)[-1]) == set(line)  # every line has the same keys
