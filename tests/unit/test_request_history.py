"""The GlobalScheduler's request history: what the table keeps of a request once it has finished."""

from __future__ import annotations

import asyncio
import time

from tests.actor_fakes import FakeHandle
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import RequestState
from tetriserve.common.stream import PlacementRequest, StateEvent
from tetriserve.control_plane.global_scheduler import GlobalScheduler


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
