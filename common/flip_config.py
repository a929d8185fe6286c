"""The ``flip`` and ``scale`` sections of the cluster config (TetriInfer §3.5; control_plane/flip,
control_plane/elastic.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FlipConfig(BaseModel):
    """When workers change role by themselves; operators flip and scale by hand under any policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    policy: Literal["off", "tetriinfer", "slo"] = Field(
        "off",
        description=(
            "off: roles change only by hand (`tetriserve flip`, `tetriserve scale`); tetriinfer: a worker under "
            "load_threshold for interval_s flips to the other role (TetriInfer §3.5); slo: capacity moves to the "
            "side missing its TTFT or TPOT objective, adding workers first while scale.max_workers allows."
        ),
    )
    check_interval_s: float = Field(1.0, gt=0, description="How often the flip policy looks at the cluster.")
    load_window_s: float = Field(
        10.0, gt=0, description="Time constant of each worker's smoothed load (the policies' utilisation)."
    )
    load_threshold: float = Field(0.10, ge=0, le=1, description="tetriinfer and slo: a worker under this load is idle.")
    interval_s: float = Field(60.0, ge=0, description="tetriinfer: how long a worker stays idle before it flips.")
    require_demand: bool = Field(
        True, description="tetriinfer: flip only toward a role with a worker at or over load_threshold."
    )
    min_prefill: int = Field(1, ge=1, description="Fewest prefill workers a policy or an operator may leave.")
    min_decode: int = Field(1, ge=1, description="Fewest decode workers a policy or an operator may leave.")
    max_prefill: int | None = Field(None, ge=1, description="slo: most prefill workers (None: no bound).")
    max_decode: int | None = Field(None, ge=1, description="slo: most decode workers (None: no bound).")
    ttft_slo_ms: float | None = Field(
        None, gt=0, description="slo: TTFT objective of requests that carry none (None: only their own count)."
    )
    tpot_slo_ms: float | None = Field(
        None, gt=0, description="slo: time-per-output-token objective of requests that carry none."
    )
    ttft_target: float = Field(0.9, gt=0, le=1, description="slo: share of requests that must meet their TTFT.")
    tpot_target: float = Field(0.9, gt=0, le=1, description="slo: share of requests that must meet their TPOT.")
    slo_window_s: float = Field(60.0, gt=0, description="slo: sliding window of finished requests judged.")
    min_samples: int = Field(20, ge=1, description="slo: fewest finished requests in the window to act on.")
    cooldown_s: float = Field(30.0, ge=0, description="slo: least time between two orders.")
    idle_s: float = Field(120.0, ge=0, description="slo: a worker idle this long may be removed (autoscaling).")
    donor_max_load: float = Field(
        0.5, gt=0, le=1, description="slo: a worker is flipped away only while its load is under this (spare)."
    )
    drain_timeout_s: float = Field(
        120.0,
        gt=0,
        description=(
            "Longest a drain waits for a worker's requests to finish; those still running then are migrated "
            "by the front doors (recomputed elsewhere, tokens kept)."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> FlipConfig:
        for role in ("prefill", "decode"):
            high = getattr(self, f"max_{role}")
            if high is not None and high < getattr(self, f"min_{role}"):
                raise ValueError(f"flip.max_{role} must be >= flip.min_{role}")
        return self


class ScaleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_workers: int = Field(
        0,
        ge=0,
        description=(
            "The slo policy may add workers up to this many in all (each a Ray actor asking for the CPUs/GPUs its "
            "engine uses, so a KubeRay autoscaler adds nodes); 0: it only flips."
        ),
    )
