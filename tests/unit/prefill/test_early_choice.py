"""When the pipelined handoff chooses its decode worker (``prefill_worker/pipeline.py``; no Ray, no engine).

A late prediction holds the choice back only where it could change it: with one accepting decode worker, a prompt
whose KV leaves in several parts is given that worker at once, on the predictor's instant estimate.
"""

from __future__ import annotations

import asyncio

from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.prefill_worker.lifecycle import PrefillJob, view_of
from tetriserve.prefill_worker.pipeline import EarlyHandoff, leaves_in_parts
from tetriserve.prefill_worker.policy import PrefillPolicySpec
from tetriserve.prefill_worker.predictions import Ticket
from tetriserve.prefill_worker.views import ReqView

INSTANT = LengthEstimate(0, 7, 100, source="instant")
PREDICTED = LengthEstimate(0, 50, 100, source="predicted")


class _Directory:
    """What EarlyHandoff reads of the decode directory: how many accept, and the dispatcher's pick."""

    def __init__(self, decodes: int, closed: int = 0) -> None:
        self.decodes, self.closed = decodes, closed
        self.picked: list[LengthEstimate | None] = []

    def accepting(self) -> int:
        return self.decodes - self.closed

    def pick(self, view: ReqView) -> str:
        self.picked.append(view.estimate)
        return "decode-0"


class _Sender:
    """Every decode worker pulls (nothing is pushed)."""

    def __init__(self) -> None:
        self.pulls: list[tuple[str, str]] = []

    def pull(self, decode_id: str, key: str) -> bool:
        self.pulls.append((decode_id, key))
        return True


async def _choice(
    directory: _Directory, prompt_len: int, chunking: str = "fixed", sender: _Sender | None = None
) -> tuple[str | None, str | None, list[LengthEstimate | None]]:
    """(chosen while the prediction was pending, chosen once it came, the estimates the choice was made on); the
    handoff says it chose on the instant estimate exactly when it chose before the prediction came."""
    loop = asyncio.get_running_loop()
    ticket = Ticket(PredictInput(prompt_len, 64), loop, loop.create_future())
    req = Request("k", tuple(range(prompt_len)), SamplingSpec(max_tokens=64))
    job = PrefillJob(req, "fd", view_of(req))
    several_parts = leaves_in_parts(PrefillPolicySpec(chunking=chunking, chunk_size=512), None, prompt_len)
    early = EarlyHandoff(
        job, ticket, directory, sender or _Sender(), lambda item: INSTANT, several_parts  # type: ignore[arg-type]
    )
    for _ in range(5):
        await asyncio.sleep(0)
    before = early.decode_id
    ticket.future.set_result(PREDICTED)
    for _ in range(5):
        await asyncio.sleep(0)
    after = early.decode_id
    assert early.on_instant == (before is not None)
    assert await early.outcome() == ((after, None) if after is not None else None)
    return before, after, directory.picked


def test_one_decode_worker_and_a_prompt_of_several_chunks_do_not_wait_for_the_prediction() -> None:
    sender = _Sender()
    before, after, picked = asyncio.run(_choice(_Directory(decodes=1), prompt_len=1500, sender=sender))
    assert before == after == "decode-0"
    assert picked == [INSTANT]  # chosen once, on the instant estimate
    assert sender.pulls == [("decode-0", Request("k", (1,)).kv_key)]  # and told to pull the parts as published


def test_with_several_decode_workers_the_choice_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Directory(decodes=2), prompt_len=1500))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_a_prompt_of_one_chunk_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Directory(decodes=1), prompt_len=512))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_without_chunking_a_long_prompt_is_one_part_and_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Directory(decodes=1), prompt_len=1500, chunking="none"))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_one_accepting_decode_worker_among_several_is_no_choice_either() -> None:
    before, after, picked = asyncio.run(_choice(_Directory(decodes=2, closed=1), prompt_len=1500))
    assert before == after == "decode-0"
    assert picked == [INSTANT]
