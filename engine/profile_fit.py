"""From timed iterations to a cost profile: sweep → pivot, samples → SOLA eq. 3 / eq. 4 (SOLA §5.2, AccelGen §4.2)
and SCLS's estimators (SCLS §4.2 eq. 3 / eq. 4, §4.3 Δ and M_ava).

    MeasuredStep (scenario, pieces, median seconds)
      ├─ SWEEP steps                      → SweepPoint(S, t)  → find_pivot → S_pf, T̄_pf
      │                                                       → find_tile → SOLA §4.4.3 tile size
      ├─ SWEEP + CHUNKED steps            → (l_has, l_in)* samples ─┐
      └─ DECODE steps where all B decode  → context-length samples ─┤
                                                                    ▼
         split by scenario (engine.profile_plan.held_out) → fit on train → mean |pred − meas| / meas
         on train and held-out → CostProfile (coefficients from the train fit, held-out errors)

    SCLS (static batches, padded to the longest input): iterations that start prompts only, every piece from
    l_has = 0 → (N, L_i = the longest piece); pure decode iterations → (l = the longest cached context, N);
    least squares on all of them (SCLS fits with ``curve_fit`` on every profiled point) → CostProfile.scls,
    with the engine's KV bytes per token (Δ) and KV pool (M_ava) as the profiler read them

Pure: no vLLM, so it is unit-tested and can refit saved samples.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tetriserve.common.cost_model import PrefillBatch, fit_decode, fit_prefill, mean_abs_pct_error
from tetriserve.common.cost_profile import CostProfile, SweepPoint, find_pivot, find_tile
from tetriserve.common.scls_estimators import SclsProfile, fit_serving_time
from tetriserve.engine.profile_plan import ScenarioKind, Step, held_out, pure_decode

X = TypeVar("X")


@dataclass(frozen=True)
class MeasuredStep:
    """One iteration of one scenario: its pieces (checked against the engine) and median time over repeats."""

    scenario: str
    kind: ScenarioKind
    batch: int  # requests in the scenario
    index: int  # iteration number within the scenario
    pieces: Step
    seconds: float
    spread: float = float("nan")  # mean |t − median| / median over the repeats: the measurement noise


@dataclass(frozen=True)
class FitReport:
    """How well one cost model fits: errors are mean |pred − meas| / meas (a fraction)."""

    train_error: float
    test_error: float
    n_train: int
    n_test: int
    test_measured: tuple[float, ...]
    test_predicted: tuple[float, ...]
    noise: float = float("nan")  # mean repeat-to-repeat spread of the same iterations: the error floor


@dataclass(frozen=True)
class Calibration:
    profile: CostProfile
    prefill: FitReport
    decode: FitReport
    saturation: float
    scls_errors: tuple[float, float] | None = None  # SCLS eq. 3 and eq. 4: mean |pred − meas| / meas, all samples


def sweep_points(steps: Sequence[MeasuredStep]) -> list[SweepPoint]:
    pts = [SweepPoint(s.pieces[0].new, s.seconds) for s in steps if s.kind is ScenarioKind.SWEEP]
    return sorted(pts, key=lambda p: p.forward_tokens)


def prefill_samples(steps: Sequence[MeasuredStep]) -> list[tuple[str, PrefillBatch, float]]:
    kinds = (ScenarioKind.SWEEP, ScenarioKind.CHUNKED)
    return [(s.scenario, [(p.has, p.new) for p in s.pieces], s.seconds) for s in steps if s.kind in kinds]


def decode_samples(steps: Sequence[MeasuredStep]) -> list[tuple[str, list[int], float]]:
    return [
        (s.scenario, [p.has for p in s.pieces], s.seconds)
        for s in steps
        if s.kind is ScenarioKind.DECODE and pure_decode(s.pieces, s.batch)
    ]


def scls_prefill_samples(steps: Sequence[MeasuredStep]) -> list[tuple[int, int, float]]:
    """SCLS eq. 3 samples, (N, L_i, seconds): iterations in which every piece starts a prompt (l_has = 0),
    L_i being the longest piece, the length a static batch pads to."""
    kinds = (ScenarioKind.SWEEP, ScenarioKind.CHUNKED)
    return [
        (len(s.pieces), max(p.new for p in s.pieces), s.seconds)
        for s in steps
        if s.kind in kinds and s.pieces and all(p.has == 0 and not p.decode for p in s.pieces)
    ]


def scls_decode_samples(steps: Sequence[MeasuredStep]) -> list[tuple[int, int, float]]:
    """SCLS eq. 4 samples, (l, N, seconds): pure decode iterations, l the longest cached context."""
    return [(max(has), len(has), t) for _, has, t in decode_samples(steps)]


def scls_profile(
    steps: Sequence[MeasuredStep], kv_bytes_per_token: float, kv_pool_bytes: float
) -> tuple[SclsProfile, tuple[float, float]] | None:
    """SCLS's estimators fitted on every sample, with their fit errors; None without samples of both kinds."""
    prefill, decode = scls_prefill_samples(steps), scls_decode_samples(steps)
    if not prefill or not decode:
        return None
    serving = fit_serving_time(prefill, decode)
    errors = (
        mean_abs_pct_error([serving.t_prefill(n, li) for n, li, _ in prefill], [t for *_, t in prefill]),
        mean_abs_pct_error([serving.tau_decode(c, n) for c, n, _ in decode], [t for *_, t in decode]),
    )
    return SclsProfile(serving, kv_bytes_per_token, kv_pool_bytes), errors


def _split(
    samples: Sequence[tuple[str, X, float]], test_names: set[str]
) -> tuple[list[tuple[X, float]], list[tuple[X, float]]]:
    train = [(x, t) for name, x, t in samples if name not in test_names]
    test = [(x, t) for name, x, t in samples if name in test_names]
    return train, test


def _report(
    predict: Callable[[X], float], train: list[tuple[X, float]], test: list[tuple[X, float]], noise: float
) -> FitReport:
    train_err = mean_abs_pct_error([predict(x) for x, _ in train], [t for _, t in train])
    test_pred = tuple(predict(x) for x, _ in test)
    test_meas = tuple(t for _, t in test)
    test_err = mean_abs_pct_error(test_pred, test_meas) if test else float("nan")
    return FitReport(train_err, test_err, len(train), len(test), test_meas, test_pred, noise)


def _noise(steps: Sequence[MeasuredStep], keep: Callable[[MeasuredStep], bool]) -> float:
    spreads = [s.spread for s in steps if keep(s) and not math.isnan(s.spread)]
    return statistics.fmean(spreads) if spreads else float("nan")


def calibrate(
    steps: Sequence[MeasuredStep],
    model: str,
    hardware: str,
    saturation: float = 0.9,
    kv_bytes_per_token: float = 0.0,
    kv_pool_bytes: float = 0.0,
) -> Calibration:
    """Fit both cost models on the train scenarios, measure them on the held-out ones, find the pivot; fit
    SCLS's estimators (``kv_bytes_per_token`` and ``kv_pool_bytes``: the engine's Δ and M_ava, 0 unknown)."""
    sweep = sweep_points(steps)
    if not sweep:
        raise ValueError("calibrate: no SWEEP iterations among the measured steps")
    pivot = find_pivot(sweep, saturation)
    test_names = held_out(list(dict.fromkeys(s.scenario for s in steps)))  # scenario order, deduplicated
    p_train, p_test = _split(prefill_samples(steps), test_names)
    d_train, d_test = _split(decode_samples(steps), test_names)
    p_cost, d_cost = fit_prefill(p_train), fit_decode(d_train)
    p_noise = _noise(steps, lambda s: s.kind is not ScenarioKind.DECODE)
    d_noise = _noise(steps, lambda s: s.kind is ScenarioKind.DECODE and pure_decode(s.pieces, s.batch))
    prefill = _report(p_cost.predict, p_train, p_test, p_noise)
    decode = _report(d_cost.predict, d_train, d_test, d_noise)
    scls = scls_profile(steps, kv_bytes_per_token, kv_pool_bytes)
    profile = CostProfile(
        model=model,
        hardware=hardware,
        prefill=p_cost,
        decode=d_cost,
        pivot_tokens=pivot.forward_tokens,
        pivot_seconds=pivot.seconds,
        prefill_fit_error=prefill.test_error,
        decode_fit_error=decode.test_error,
        sweep=tuple(sweep),
        tile_tokens=find_tile(sweep),
        scls=scls[0] if scls is not None else None,
    )
    return Calibration(profile, prefill, decode, saturation, scls[1] if scls is not None else None)
