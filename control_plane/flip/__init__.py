"""Flip policies (TetriInfer §3.5 and beyond): ``off``, ``tetriinfer``, ``slo``; see ``base.py`` for the seam."""

from __future__ import annotations

from collections.abc import Callable

from tetriserve.common.flip_config import FlipConfig
from tetriserve.control_plane.flip.base import (
    Attainment,
    ClusterSnapshot,
    FlipOrder,
    FlipPolicy,
    Order,
    RemoveOrder,
    ScaleOrder,
    WorkerView,
)
from tetriserve.control_plane.flip.off import NoFlip
from tetriserve.control_plane.flip.slo import SloFlip, SloParams
from tetriserve.control_plane.flip.tetriinfer import TetriInferFlip, TetriInferParams

FLIP_POLICY_NAMES = ("off", "tetriinfer", "slo")


def make_flip_policy(name: str, **params: object) -> FlipPolicy:
    """``params`` go to the policy's parameter dataclass; a ValueError names what is wrong."""
    try:
        if name == "off":
            if params:
                raise TypeError(f"takes no parameters, got {sorted(params)}")
            return NoFlip()
        if name == "tetriinfer":
            tetriinfer: Callable[..., TetriInferParams] = TetriInferParams
            return TetriInferFlip(tetriinfer(**params))
        if name == "slo":
            slo: Callable[..., SloParams] = SloParams
            return SloFlip(slo(**params))
    except TypeError as exc:
        raise ValueError(f"flip policy {name!r}: {exc}") from None
    raise ValueError(f"flip.policy: unknown policy {name!r}; known: {list(FLIP_POLICY_NAMES)}")


def policy_from_config(cfg: FlipConfig, base_workers: int = 0) -> FlipPolicy:
    """The policy ``cfg.policy`` with its parameters from the ``flip`` config section; ``slo`` never scales in
    below ``base_workers`` (the count ``serve`` started with)."""
    if cfg.policy == "tetriinfer":
        return TetriInferFlip(
            TetriInferParams(cfg.load_threshold, cfg.interval_s, cfg.min_prefill, cfg.min_decode, cfg.require_demand)
        )
    if cfg.policy == "slo":
        params = SloParams(
            ttft_target=cfg.ttft_target,
            tpot_target=cfg.tpot_target,
            min_samples=cfg.min_samples,
            cooldown_s=cfg.cooldown_s,
            min_prefill=cfg.min_prefill,
            min_decode=cfg.min_decode,
            max_prefill=cfg.max_prefill,
            max_decode=cfg.max_decode,
            base_workers=base_workers,
            idle_threshold=cfg.load_threshold,
            idle_s=cfg.idle_s,
            donor_max_load=cfg.donor_max_load,
        )
        return SloFlip(params)
    return NoFlip()


__all__ = [
    "FLIP_POLICY_NAMES",
    "Attainment",
    "ClusterSnapshot",
    "FlipOrder",
    "FlipPolicy",
    "Order",
    "RemoveOrder",
    "ScaleOrder",
    "WorkerView",
    "make_flip_policy",
    "policy_from_config",
]
