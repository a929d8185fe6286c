"""The decode planner (decode_worker/planner.py) driven without an engine: hand-built views, a block pool given as
numbers, and the time passed in. Expected values are literals; the arithmetic is in the comments."""

from __future__ import annotations

import pytest

from tetriserve.decode_worker.admission import make_admission_policy
from tetriserve.decode_worker.planner import STEP_MAX_WINDOW, Admission, DecodePlanner, SliceProgress
from tetriserve.decode_worker.preemption import PreemptionStrategy, make_preemption_order
from tetriserve.decode_worker.views import DecodeReqView, DecodeState


def _view(rid: str, prompt: int, max_tokens: int = 64, arrival: float = 0.0, **kw: object) -> DecodeReqView:
    return DecodeReqView(rid, prompt, max_tokens, arrival_time=arrival, **kw)  # type: ignore[arg-type]


def test_greedy_admission_holds_the_first_refused_request_and_every_one_after_it() -> None:
    # block size 16, 10 free: A (32 tokens) takes 2 -> 8 free; B (150 tokens) needs ceil(150/16) = 10 > 8:
    # refused; C (16 tokens, 1 block) would fit but comes after a refusal, so it waits too
    planner = DecodePlanner(admission=make_admission_policy("greedy"))
    state = DecodeState(free_blocks=10, block_size=16)
    waiting = [_view("C", 16, arrival=3.0), _view("A", 32, arrival=1.0), _view("B", 150, arrival=2.0)]
    assert planner.admit(waiting, state) == Admission(admitted=("A",), held=("B", "C"))


def test_each_admitted_request_is_folded_into_the_state_before_the_next_is_asked() -> None:
    # 4 free blocks of 16: A (48 tokens) takes 3 -> 1 free; B (32 tokens) needs 2 > 1: refused
    planner = DecodePlanner(admission=make_admission_policy("greedy"))
    state = DecodeState(free_blocks=4, block_size=16)
    assert planner.admit([_view("A", 48, arrival=1.0), _view("B", 32, arrival=2.0)], state) == Admission(("A",), ("B",))
    # with 5 free: A -> 2 free, B takes 2 -> 0 free
    assert planner.admit([_view("A", 48, arrival=1.0), _view("B", 32, arrival=2.0)], DecodeState(5, 16)) == Admission(
        ("A", "B"), ()
    )


def test_reserve_static_admits_by_the_whole_output_not_the_context() -> None:
    # reserve-static asks for ceil((prompt + max_tokens) / 16) blocks: A 32 + 64 = 96 -> 6 of 8 free; B
    # 16 + 64 = 80 -> 5 > 2 left: refused (greedy would admit B: 1 block)
    planner = DecodePlanner(admission=make_admission_policy("reserve-static"))
    decision = planner.admit([_view("A", 32, arrival=1.0), _view("B", 16, arrival=2.0)], DecodeState(8, 16))
    assert decision == Admission(("A",), ("B",))


@pytest.mark.parametrize(
    ("tokens_left", "free", "expected"),
    [
        ([1, 1, 40], 4, True),  # 1 + 1 + (ceil(40/16) + 1 = 4) = 6 blocks > 4
        ([1, 1, 40], 6, False),  # 6 ≤ 6
        ([0, 1], 2, False),  # two decoding requests: one block each at most
        ([], 0, False),
    ],
)
def test_may_run_out_counts_one_block_per_decoding_request_and_the_rest_of_a_recompute(
    tokens_left: list[int], free: int, expected: bool
) -> None:
    assert DecodePlanner.may_run_out(tokens_left, free, 16) is expected


def test_victims_follow_the_order_and_requests_in_transfer_go_last() -> None:
    planner = DecodePlanner(victim_order=make_preemption_order("srtf"))
    # srtf preempts the longest remaining first: b (100 left), c (50), a (10); c's KV is in flight: last
    running = [_view("a", 8, 10), _view("b", 8, 100), _view("c", 8, 50, transferring=True)]
    assert planner.reorders(3)
    assert planner.victims(running) == ["b", "a", "c"]


def test_the_vllm_order_and_a_batch_of_one_leave_the_engines_own_order() -> None:
    assert not DecodePlanner(victim_order=make_preemption_order("vllm")).reorders(5)
    assert not DecodePlanner(victim_order=make_preemption_order("srtf")).reorders(1)


def test_the_step_time_is_a_smoothed_gap_between_busy_steps() -> None:
    planner = DecodePlanner()
    assert planner.observe_step(10.0, busy=True) == 0.0  # the first step: no gap yet
    assert planner.observe_step(10.1, busy=True) == pytest.approx(0.1)  # the first gap as it is
    assert planner.observe_step(10.3, busy=True) == pytest.approx(0.12)  # 0.8 * 0.1 + 0.2 * 0.2
    assert planner.observe_step(11.0, busy=False) == pytest.approx(0.12)  # an idle spell is no step time
    assert planner.observe_step(11.05, busy=True) == pytest.approx(0.106)  # 0.8 * 0.12 + 0.2 * 0.05
    assert planner.max_step_s == pytest.approx(0.2)  # CacheOpt's T_I^max: the longest busy gap, 10.1 → 10.3


def test_the_longest_step_is_taken_over_a_window_of_recent_steps() -> None:
    planner = DecodePlanner()
    assert planner.max_step_s == 0.0  # no step yet
    planner.observe_step(10.0, busy=True)
    planner.observe_step(11.0, busy=True)  # one slow step of 1 s
    for i in range(1, STEP_MAX_WINDOW):
        planner.observe_step(11.0 + 0.01 * i, busy=True)  # then 255 steps of 0.01 s
    assert planner.max_step_s == pytest.approx(1.0)  # 256 gaps: the slow one is still in the window
    planner.observe_step(11.0 + 0.01 * STEP_MAX_WINDOW, busy=True)
    assert planner.max_step_s == pytest.approx(0.01)  # one more: it has left


def test_preemptions_swap_only_what_was_computed_and_can_be_swapped_and_are_timed_until_resumed() -> None:
    planner = DecodePlanner(strategy=PreemptionStrategy("swap"))
    assert planner.preempted("a", computed=0, now=1.0, can_swap=True) == "recompute"  # nothing to swap
    assert planner.preempted("b", computed=50, now=1.0, can_swap=False) == "recompute"  # no swap path
    assert planner.preempted("c", computed=50, now=1.0, can_swap=True) == "swap"
    assert (planner.stats.count, planner.stats.swapped, planner.stats.recomputed) == (3, 1, 2)
    # a is gone (finished while out); b is not running; c runs with 49 of its 50 tokens restored: not back
    planner.resumed({"b": None, "c": 49}, now=2.0)
    assert planner.preempted_ids == ("b", "c") and planner.stats.durations_s == []
    assert planner.preempted_at("c") == 1.0 and planner.preempted_at("a") is None  # a was dropped
    planner.resumed({"b": 50, "c": 50}, now=2.5)  # both back: out 2.5 - 1.0 = 1.5 s each
    assert planner.stats.durations_s == [1.5, 1.5] and planner.preempted_ids == ()


def test_slice_cuts_take_decoding_requests_at_a_multiple_of_the_slice_short_of_their_end() -> None:
    planner = DecodePlanner(slice_iters=4)
    progress = [
        SliceProgress("at-boundary", produced=8, decoding=True, max_tokens=20),
        SliceProgress("not-decoding", produced=8, decoding=False, max_tokens=20),
        SliceProgress("mid-slice", produced=7, decoding=True, max_tokens=20),
        SliceProgress("at-its-end", produced=8, decoding=True, max_tokens=8),  # finishes anyway
    ]
    assert planner.slice_cuts(progress) == ["at-boundary"]
    assert DecodePlanner(slice_iters=0).slice_cuts(progress) == []
