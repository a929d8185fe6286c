"""The GlobalScheduler's request history: what the table keeps of a request once it has finished."""

from __future__ import annotations

import asyncio
import time

from tests.actor_fakes import FakeHandle
from tetriserve.common.length import LengthEstimate
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import RequestState
from tetriserve.common.stream import PlacementRequest, StateEvent
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.engine.worker_base import estimate_metrics


class _Prefill:
    def observe(self, prompt_len: int, output_len: int) -> None:
        return None


def test_a_workers_report_that_comes_after_the_front_doors_finish_still_lands_in_the_history() -> None:
    async def main() -> None:
        gs = GlobalScheduler({"prefill-0": FakeHandle(_Prefill())})
        gs.prefill_loads = {"prefill-0": PrefillLoad("prefill-0", 0, 0, 0, 0.0)}
        now = time.time()
        await gs.place(PlacementRequest("r", 10, 8, now))
        await gs.record([StateEvent("r", RequestState.TRANSFERRING, now + 1, "prefill-0")])
        await gs.record([StateEvent("r", RequestState.FINISHED_LENGTH, now + 3, "frontdoor", "length", 8)])
        await gs.record(  # the decode worker's batch, sent with its next report
            [
                StateEvent("r", RequestState.DECODE_QUEUED, now + 1.5, "prefill-0", "decode-0", moved_to="decode-0"),
                StateEvent("r", RequestState.DECODING, now + 2, "decode-0"),
                StateEvent("r", RequestState.DECODING, now + 9, "decode-0"),  # after the finish: not history
                StateEvent("r", RequestState.DECODING, now + 2.5, "decode-0", attempt=1),  # another attempt's
            ]
        )
        (done,) = await gs.recent(1)
        assert [e.state for e in done.events][1:] == [
            RequestState.PREFILLING,
            RequestState.TRANSFERRING,
            RequestState.DECODE_QUEUED,
            RequestState.DECODING,
            RequestState.FINISHED_LENGTH,
        ]
        assert done.state is RequestState.FINISHED_LENGTH and gs.counts["finished"] == 1

    asyncio.run(main())


def test_the_table_keeps_the_estimate_the_handoff_carried_and_the_one_the_request_ended_with() -> None:
    async def main() -> None:
        gs = GlobalScheduler({"prefill-0": FakeHandle(_Prefill())})
        gs.prefill_loads = {"prefill-0": PrefillLoad("prefill-0", 0, 0, 0, 0.0)}
        now = time.time()
        instant = LengthEstimate(10, 40, 90, source="instant")
        model = LengthEstimate(100, 150, 200, bucket=1, source="trained")
        await gs.place(PlacementRequest("r", 10, 300, now))
        await gs.record(
            [StateEvent("r", RequestState.DECODE_QUEUED, now + 1, "prefill-0", "decode-0", 0, "decode-0", 0, instant)]
        )
        assert gs.table["r"].length_estimate == instant  # the handoff went on the instant estimate
        await gs.record([StateEvent("r", RequestState.FINISHED_LENGTH, now + 3, "frontdoor", "length", 160)])
        # the decode worker's finish comes after the front door's, with the late prediction that replaced it
        await gs.record(
            [StateEvent("r", RequestState.FINISHED_LENGTH, now + 2.9, "decode-0", "length", 160, estimate=model)]
        )
        (done,) = await gs.recent(1)
        assert done.length_estimate == model

    asyncio.run(main())


def test_a_finished_requests_last_chunk_carries_its_estimate_as_per_request_metrics() -> None:
    assert estimate_metrics(None) is None
    assert estimate_metrics(LengthEstimate(100, 150, 200)) == {
        "predicted_output_tokens": 150.0,
        "predicted_output_tokens_lower": 100.0,
        "predicted_output_tokens_upper": 200.0,
    }
