"""Decode-side policies from configuration: admission, preemption order, swap or recompute.

Each is a pure object over frozen views (``docs/design/policy-seam.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tetriserve.common.config import ADMISSION_PARAMS, DECODE_MONITOR_KEYS, DecodeConfig, apply_dotted
from tetriserve.common.config_keys import leaf_keys
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.decode_worker.admission import AdmissionPolicy, make_admission_policy
from tetriserve.decode_worker.preemption import (
    PreemptionCosts,
    PreemptionOrder,
    PreemptionStrategy,
    make_preemption_order,
)


def decode_policies(
    cfg: DecodeConfig, cost: CostEstimator | None = None
) -> tuple[AdmissionPolicy, PreemptionOrder, PreemptionStrategy]:
    """Build the configured policies; a ValueError names the setting that is wrong. ``cost``: the worker's cost
    models, which ``sola`` admission reads (SOLA eq. 4) when there are some."""
    costs = None
    if cfg.preemption.profile:
        try:
            costs = PreemptionCosts.load(Path(cfg.preemption.profile))
        except ValueError as exc:
            raise ValueError(f"decode.preemption.profile: {exc}") from None
    params = cfg.admission.policy_kwargs()
    if cfg.admission.policy == "sola" and cost is not None:
        params = {**params, "cost": cost}
    return (
        make_admission_policy(cfg.admission.policy, **params),
        make_preemption_order(cfg.preemption.order),
        PreemptionStrategy(cfg.preemption.mode, costs),
    )


def updated_decode_config(cfg: DecodeConfig, changes: Mapping[str, object]) -> DecodeConfig:
    """``cfg`` with ``changes`` (dotted keys below ``decode``: ``admission.policy``, ``slice_iters``) applied and
    validated; a ValueError names every bad ``decode.<key>``. A change of admission policy drops the parameters
    set for the one before it that the new one does not take (``apply_dotted``)."""
    data: dict[str, object] = cfg.model_dump(exclude_unset=True)
    apply_dotted(data, changes, below="decode")
    try:
        return DecodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError("; ".join(map(_said, exc.errors()))) from None


def _said(error: ErrorDetails) -> str:
    """One validation error as ``decode.<key>: why`` (a model check's own message names its key already)."""
    message = error["msg"].removeprefix("Value error, ")
    if message.startswith("decode."):
        return message
    return f"decode.{'.'.join(map(str, error['loc'])) or 'changes'}: {message}"


def decode_policy_settings(cfg: DecodeConfig) -> dict[str, str]:
    """The policy settings in force by their dotted keys below ``decode``, as ``policy show`` lists them: the
    admission policy's own parameters only, no unset profile, not the cluster monitor's keys."""
    own = {f"admission.{n}" for n in ADMISSION_PARAMS[cfg.admission.policy]}
    shown = {}
    for key in leaf_keys(DecodeConfig):
        if key.path in DECODE_MONITOR_KEYS or (key.path.startswith("admission.") and key.path != "admission.policy"
                                               and key.path not in own):  # fmt: skip
            continue
        value: object = cfg
        for part in key.path.split("."):
            value = getattr(value, part)
        if value is not None:
            shown[key.path] = str(value)
    return shown
