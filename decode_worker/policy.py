"""Decode-side policies from configuration: admission, preemption order, swap or recompute.

Each is a pure object over frozen views (``docs/design/policy-seam.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from tetriserve.common.config import DECODE_MONITOR_KEYS, DecodeConfig
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


def updated_decode_config(cfg: DecodeConfig, changes: Mapping[str, object]) -> DecodeConfig:
    """``cfg`` with ``changes`` applied and validated; a ValueError names every bad ``decode.<field>``."""
    try:
        return DecodeConfig.model_validate({**cfg.model_dump(), **changes})
    except ValidationError as exc:
        bad = "; ".join(f"decode.{'.'.join(map(str, e['loc'])) or 'changes'}: {e['msg']}" for e in exc.errors())
        raise ValueError(bad) from None


def decode_policy_settings(cfg: DecodeConfig) -> dict[str, str]:
    """The policy settings in force, as ``policy show`` lists them (cacheopt's knobs only under cacheopt)."""
    shown = cfg.model_dump(exclude_none=True, exclude=set(DECODE_MONITOR_KEYS))
    if cfg.admission_policy != "cacheopt":
        shown = {k: v for k, v in shown.items() if not k.startswith("cacheopt_")}
    return {k: str(v) for k, v in shown.items()}
