"""What a policy decided differently from the default: counts by decision, under the policy's name.

A policy object that can decide otherwise than the service's default (FCFS order, greedy admission, vLLM's
preemption from the tail, the whole waiting queue in the batch) holds a ``Decisions`` and counts each such
decision under a short name (``reordered``, ``held``, ``preempted``, ``switched_to_tpot``). The worker reports
them in ``stats()["decisions"]`` and ``/metrics`` exports them as
``tetriserve:policy_decisions_total{worker, role, policy, decision}``, so an operator can see a switched-on
policy at work, and a comparison can say how often it departed from the default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Decisions:
    """One policy's decision counts (only ever growing, like a Prometheus counter)."""

    policy: str
    counts: Counter[str] = field(default_factory=Counter)

    def count(self, decision: str, n: int = 1) -> None:
        if n:
            self.counts[decision] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


class Decides(Protocol):
    """A policy that reports its decisions."""

    @property
    def decisions(self) -> Decisions: ...


def decisions_of(policies: Iterable[object]) -> dict[str, dict[str, int]]:
    """``{policy: {decision: count}}`` over the policies that count decisions (the others are skipped); two
    objects under one policy name add up."""
    out: dict[str, Counter[str]] = {}
    for p in policies:
        d = getattr(p, "decisions", None)
        if isinstance(d, Decisions):
            out.setdefault(d.policy, Counter()).update(d.counts)
    return {name: dict(c) for name, c in out.items()}


def as_settings(decisions: Mapping[str, Mapping[str, int]]) -> dict[str, str]:
    """The counts as ``status`` and ``policy show`` list a worker's policy: ``decided.<policy>.<decision>``."""
    return {f"decided.{p}.{d}": str(n) for p, counts in sorted(decisions.items()) for d, n in sorted(counts.items())}
