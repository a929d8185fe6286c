"""Decode-side policies from configuration: admission, preemption order, swap or recompute.

Each is a pure object over frozen views (``docs/design/policy-seam.md``). The scls admission policy (SCLS §4.2,
§4.4) takes its serving-time estimator's coefficients (eq. 3, eq. 4) from a cost profile's ``scls`` section and
its slice length S from ``decode.slice_iters``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tetriserve.common.config import (
    ADMISSION_PARAMS,
    DECODE_MONITOR_KEYS,
    SCLS_SLICE_ITERS,
    DecodeConfig,
    apply_dotted,
)
from tetriserve.common.config_keys import leaf_keys
from tetriserve.common.cost_estimator import CostEstimator
from tetriserve.common.cost_profile import CostProfile
from tetriserve.common.scls_estimators import ServingTime
from tetriserve.decode_worker.admission import AdmissionPolicy, make_admission_policy
from tetriserve.decode_worker.preemption import (
    PreemptionCosts,
    PreemptionOrder,
    PreemptionStrategy,
    make_preemption_order,
)


def scls_serving_time(path: str | None, default: Path | None = None) -> ServingTime:
    """The scls estimator's coefficients: from ``path``'s ``scls`` section (which must exist), else from
    ``default`` (this model's profile on this hardware) where it exists and has one, else the built-in
    values (the tiny model on the 2-core CPU machine)."""
    if path is not None:
        try:
            profile = CostProfile.load(path)
        except ValueError as exc:
            raise ValueError(f"decode.admission.cost_profile: {exc}") from None
        if profile.scls is None:
            raise ValueError(
                f"decode.admission.cost_profile: {path} has no scls section: rerun `tetriserve profile` to write it"
            )
        return profile.scls.serving
    if default is not None and default.exists():
        try:
            found = CostProfile.load(default).scls
        except ValueError:
            found = None
        if found is not None:
            return found.serving
    return ServingTime()


def admission_policy(
    cfg: DecodeConfig, cost: CostEstimator | None = None, default_profile: Path | None = None
) -> AdmissionPolicy:
    """The configured admission policy; sola gets the worker's cost models (SOLA eq. 4) when there are some;
    scls gets its estimator and S (``slice_iters``, or the paper's 128 where slicing is off on this worker: the
    horizon its memory test looks over)."""
    kwargs = cfg.admission.policy_kwargs()
    if cfg.admission.policy == "sola" and cost is not None:
        kwargs["cost"] = cost
    if cfg.admission.policy == "scls":
        path = kwargs.pop("cost_profile")
        kwargs["serving"] = scls_serving_time(path if isinstance(path, str) else None, default_profile)
        kwargs["slice_iters"] = cfg.slice_iters or SCLS_SLICE_ITERS
    return make_admission_policy(cfg.admission.policy, **kwargs)


def decode_policies(
    cfg: DecodeConfig, cost: CostEstimator | None = None, default_profile: Path | None = None
) -> tuple[AdmissionPolicy, PreemptionOrder, PreemptionStrategy]:
    """Build the configured policies; a ValueError names the setting that is wrong. ``cost``: the worker's cost
    models, which ``sola`` admission reads (SOLA eq. 4) when there are some; ``default_profile``: the cost
    profile this model has on this hardware, where scls looks without ``decode.admission.cost_profile``."""
    costs = None
    if cfg.preemption.profile:
        try:
            costs = PreemptionCosts.load(Path(cfg.preemption.profile))
        except ValueError as exc:
            raise ValueError(f"decode.preemption.profile: {exc}") from None
    return (
        admission_policy(cfg, cost, default_profile),
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
