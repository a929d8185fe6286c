"""A policy's decision counts, as the workers report them (common/decisions.py)."""

from __future__ import annotations

from tetriserve.common.decisions import Decisions, as_settings, decisions_of


class _Counts:
    name = "sola"

    def __init__(self) -> None:
        self.decisions = Decisions("sola")


def test_policies_that_count_are_gathered_by_name_and_the_rest_skipped() -> None:
    a, b = _Counts(), _Counts()
    a.decisions.count("reordered")
    a.decisions.count("held", 2)
    b.decisions.count("held")
    b.decisions.count("unused", 0)  # a zero count leaves no entry
    assert decisions_of([a, b, object()]) == {"sola": {"reordered": 1, "held": 3}}  # held: 2 + 1


def test_shown_as_settings_sorted_by_policy_and_decision() -> None:
    both = {"sola": {"held": 3}, "scls": {"batches": 4}}
    assert as_settings(both) == {"decided.scls.batches": "4", "decided.sola.held": "3"}
