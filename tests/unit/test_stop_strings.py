"""Stop strings matched over the whole text, with text that could start one held back."""

from __future__ import annotations

from tetriserve.frontdoor.stop_strings import StopMatcher


def test_a_stop_string_split_over_deltas_ends_the_text_before_it() -> None:
    m = StopMatcher(["END", "\n\n"])
    sent = [m.feed("hello E"), m.feed("N"), m.feed("D and more")]
    assert "".join(sent) == "hello " and m.stopped == "END"
    assert sent[0] == "hello" and m.feed("more") == ""  # " E" could have been "END": held back


def test_without_a_match_everything_comes_out_by_the_flush() -> None:
    m = StopMatcher(["abc"])
    assert m.feed("xxab") == "xx" and m.feed("x") == "a" and m.flush() == "bx" and m.stopped is None


def test_the_earliest_stop_string_wins_and_none_means_no_hold() -> None:
    m = StopMatcher(["world", "o w"])
    assert m.feed("hello world") == "hell" and m.stopped == "o w"
    assert StopMatcher([]).feed("abc") == "abc"
