"""Dispatch policies: which decode worker receives a prefilled request (TetriInfer §3.3.4)."""

from __future__ import annotations

from tetriserve.prefill_worker.dispatch.base import DispatchParams, DispatchPolicy
from tetriserve.prefill_worker.dispatch.load_based import Imbalance, LeastLoaded, MaxMin
from tetriserve.prefill_worker.dispatch.power_of_two import PowerOfTwo
from tetriserve.prefill_worker.dispatch.simple import RandomChoice, RoundRobin

DISPATCH_POLICIES: dict[str, type[DispatchPolicy]] = {
    PowerOfTwo.name: PowerOfTwo,
    RandomChoice.name: RandomChoice,
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
    Imbalance.name: Imbalance,
    MaxMin.name: MaxMin,
}


def make_dispatch_policy(name: str, params: DispatchParams) -> DispatchPolicy:
    try:
        return DISPATCH_POLICIES[name](params)
    except KeyError:
        raise ValueError(
            f"prefill.dispatch_policy: unknown policy {name!r}; known: {sorted(DISPATCH_POLICIES)}"
        ) from None


__all__ = ["DISPATCH_POLICIES", "DispatchParams", "DispatchPolicy", "make_dispatch_policy"]
