"""The front door's token log: chunks from several workers, out of order, duplicated, stale, in one order out."""

from __future__ import annotations

from tetriserve.common.stream import FinishReason, StreamChunk
from tetriserve.frontdoor.token_log import AT_ONCE, TokenLog


def _c(tokens: tuple[int, ...], index: int, worker: str = "d0", **kw: object) -> StreamChunk:
    return StreamChunk("r", tokens, worker=worker, index=index, **kw)  # type: ignore[arg-type]


def _flat(chunks: list[StreamChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_held_chunks_are_released_in_order_and_duplicates_dropped() -> None:
    log = TokenLog("r", "p0")
    assert log.add(_c((3, 4), 2)) == []
    assert _flat(log.add(_c((1,), 0, "p0"))) == [1]
    out = log.add(_c((1, 2, 3), 0))  # overlaps both what was sent and what is held
    assert _flat(out) == [2, 3, 4] and log.tokens == [1, 2, 3, 4]
    assert log.stats.duplicates == 2 and not log.done


def test_a_finish_waits_for_the_tokens_before_it() -> None:
    log = TokenLog("r", "p0")
    assert log.add(_c((9,), 1, finish_reason=FinishReason.STOP)) == []
    out = log.add(_c((8,), 0, "p0"))
    assert _flat(out) == [8, 9] and out[-1].finish_reason == "stop" and log.done
    assert log.add(_c((10,), 2)) == []  # nothing after the finish


def test_the_log_knows_where_the_request_is_from_markers_and_tokens_in_any_order() -> None:
    log = TokenLog("r", "p0")
    log.add(_c((), 5, "d0", moved_to="d1"))  # d0 -> d1 at token 5 arrives first
    log.add(_c((), 1, "p0", moved_to="d0"))  # then the handoff p0 -> d0 at token 1
    assert log.worker == "d1"
    log.add(_c((7,), 9, "d1"))
    assert log.worker == "d1"


def test_stale_attempts_are_dropped_and_a_front_door_finish_ends_the_stream_at_once() -> None:
    log = TokenLog("r", "p0", attempt=1)
    assert log.add(_c((1,), 0, attempt=0)) == [] and log.stats.stale == 1
    assert _flat(log.add(_c((1,), 0, attempt=1))) == [1]
    log.add(_c((3,), 2, attempt=1))  # held: token 1 is missing
    out = log.add(_c((), AT_ONCE, "frontdoor", finish_reason=FinishReason.ABORT, attempt=1))
    assert out[-1].finish_reason == "abort" and out[-1].index == 1 and log.tokens == [1]
