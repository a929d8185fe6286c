"""Decode-side policies from configuration (DESIGN.md §4): admission, preemption order, swap or recompute."""

from __future__ import annotations

from pathlib import Path

from tetriserve.common.config import DecodeConfig
from tetriserve.decode_worker.admission import AdmissionPolicy, make_admission_policy
from tetriserve.decode_worker.preemption import (
    PreemptionCosts,
    PreemptionOrder,
    PreemptionStrategy,
    make_preemption_order,
)


def decode_policies(cfg: DecodeConfig) -> tuple[AdmissionPolicy, PreemptionOrder, PreemptionStrategy]:
    """Build the configured policies; a ValueError names the setting that is wrong."""
    costs = None
    if cfg.preemption_profile:
        try:
            costs = PreemptionCosts.load(Path(cfg.preemption_profile))
        except ValueError as exc:
            raise ValueError(f"decode.preemption_profile: {exc}") from None
    return (
        make_admission_policy(cfg.admission_policy, **cfg.policy_kwargs()),
        make_preemption_order(cfg.preemption_order),
        PreemptionStrategy(cfg.preemption_mode, costs),
    )
