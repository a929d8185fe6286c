"""When the pipelined handoff chooses its decode worker (``prefill_worker/pipeline.py``; no Ray, no engine).

A late prediction holds the choice back only where it could change it: with one accepting decode worker, a prompt
whose KV leaves in several parts is given that worker at once, on the predictor's instant estimate.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.prefill_worker.pipeline import EarlyHandoff
from tetriserve.prefill_worker.policy import PrefillPolicySpec
from tetriserve.prefill_worker.predictions import Ticket
from tetriserve.prefill_worker.views import ReqView

INSTANT = LengthEstimate(0, 7, 100, source="instant")
PREDICTED = LengthEstimate(0, 50, 100, source="predicted")


class _Worker:
    """What EarlyHandoff reads of a prefill worker; every decode worker pulls (nothing is pushed)."""

    def __init__(self, decodes: int, chunking: str = "fixed", closed: int = 0) -> None:
        self.policy = SimpleNamespace(spec=PrefillPolicySpec(chunking=chunking, chunk_size=512), cost=None)
        self.decode_loads: dict[str, Any] = {
            f"decode-{i}": SimpleNamespace(worker_id=f"decode-{i}", accepting=i >= closed) for i in range(decodes)
        }
        self.predictions = SimpleNamespace(predictor=SimpleNamespace(instant=lambda item: INSTANT))
        self.picked: list[LengthEstimate | None] = []
        self.pulls: list[tuple[str, str]] = []

    def pick_decode(self, view: ReqView) -> str:
        self.picked.append(view.estimate)
        return "decode-0"

    def pulled_by(self, decode_id: str, key: str) -> bool:
        self.pulls.append((decode_id, key))
        return True


async def _choice(worker: _Worker, prompt_len: int) -> tuple[str | None, str | None, list[LengthEstimate | None]]:
    """(chosen while the prediction was pending, chosen once it came, the estimates the choice was made on); the
    handoff says it chose on the instant estimate exactly when it chose before the prediction came."""
    loop = asyncio.get_running_loop()
    ticket = Ticket(PredictInput(prompt_len, 64), loop, loop.create_future())
    early = EarlyHandoff(worker, "k", ReqView("k", prompt_len, 64, 0.0), ticket)  # type: ignore[arg-type]
    for _ in range(5):
        await asyncio.sleep(0)
    before = early.decode_id
    ticket.future.set_result(PREDICTED)
    for _ in range(5):
        await asyncio.sleep(0)
    after = early.decode_id
    assert early.on_instant == (before is not None)
    assert await early.outcome() == ((after, None) if after is not None else None)
    return before, after, worker.picked


def test_one_decode_worker_and_a_prompt_of_several_chunks_do_not_wait_for_the_prediction() -> None:
    worker = _Worker(decodes=1)
    before, after, picked = asyncio.run(_choice(worker, prompt_len=1500))
    assert before == after == "decode-0"
    assert picked == [INSTANT]  # chosen once, on the instant estimate
    assert worker.pulls == [("decode-0", "k")]  # and told to pull the parts as they are published


def test_with_several_decode_workers_the_choice_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Worker(decodes=2), prompt_len=1500))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_a_prompt_of_one_chunk_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Worker(decodes=1), prompt_len=512))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_without_chunking_a_long_prompt_is_one_part_and_waits_for_the_prediction() -> None:
    before, after, picked = asyncio.run(_choice(_Worker(decodes=1, chunking="none"), prompt_len=1500))
    assert before is None and after == "decode-0"
    assert picked == [PREDICTED]


def test_one_accepting_decode_worker_among_several_is_no_choice_either() -> None:
    before, after, picked = asyncio.run(_choice(_Worker(decodes=2, closed=1), prompt_len=1500))
    assert before == after == "decode-0"
    assert picked == [INSTANT]
