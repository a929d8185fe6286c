"""A model's cost profile on one kind of hardware: what ``tetriserve profile`` writes and the policies read.

    forward-size sweep ─▶ throughput(S) = S / t(S)
    pivot S_pf = the smallest S whose throughput reaches ``saturation`` × the best  (AccelGen §4.2 S_pf,
    T̄_pf = t(S_pf)                                                                TetriInfer §3.3.3 ChunkSize)
    + the fitted SOLA cost models (common.cost_model) and their fit errors
    + SCLS's estimators (common.scls_estimators: eq. 3/4's p1–p4, d1–d4, Δ and M_ava), where profiled

Profiles live in ``$TETRISERVE_HOME/profiles/<model>--<hardware>.json`` unless a path is given.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from tetriserve.common.coerce import as_float, as_int
from tetriserve.common.cost_model import DecodeCost, PrefillCost
from tetriserve.common.scls_estimators import SclsProfile

_T = TypeVar("_T")


@dataclass(frozen=True)
class SweepPoint:
    forward_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.forward_tokens / self.seconds if self.seconds > 0 else 0.0


def find_pivot(points: Sequence[SweepPoint], saturation: float = 0.9) -> SweepPoint:
    """The smallest forward size whose throughput is at least ``saturation`` of the sweep's best."""
    if not points:
        raise ValueError("find_pivot: empty sweep")
    if not 0.0 < saturation <= 1.0:
        raise ValueError(f"saturation must be in (0, 1], got {saturation}")
    best = max(p.tokens_per_s for p in points)
    return min((p for p in points if p.tokens_per_s >= saturation * best), key=lambda p: p.forward_tokens)


def find_tile(points: Sequence[SweepPoint], tolerance: float = 0.05) -> int | None:
    """SOLA §4.4.3's tile quantum (after Sarathi-Serve's tile quantisation): the largest power-of-two forward
    size T of the sweep such that, for T and every smaller power of two, the midpoint 1.5·T takes at least
    (1 − ``tolerance``) of the time 2·T takes — the tokens from 1.5·T up to 2·T come at no cost; None when the
    smallest size already fails.

    The sweep (``engine/profile_plan.py``'s ``forward_sizes``) times powers of two and their midpoints. Where
    the hardware pads a forward to whole tiles of T, every forward up to T is padded to one tile, and 1.5·T
    to 2·T, so each T' ≤ T passes; above the tile 1.5·T' takes about 3/4 of 2·T' and fails. Below the engine's
    saturation the forward time is flat, so there the largest passing size is where the forward stops being
    free, the coarser of the two quanta."""
    by_size = {p.forward_tokens: p.seconds for p in points}
    found: int | None = None
    for t in sorted(by_size):
        if t & (t - 1) or (t + t // 2) not in by_size or 2 * t not in by_size or by_size[2 * t] <= 0:
            continue
        if by_size[t + t // 2] < (1.0 - tolerance) * by_size[2 * t]:
            break
        found = t
    return found


@dataclass(frozen=True)
class CostProfile:
    model: str
    hardware: str
    prefill: PrefillCost
    decode: DecodeCost
    pivot_tokens: int  # S_pf = the ChunkSize at which throughput saturates
    pivot_seconds: float  # T̄_pf = one iteration's time at S_pf
    prefill_fit_error: float = float("nan")  # mean |pred − meas| / meas on held-out iterations
    decode_fit_error: float = float("nan")
    sweep: tuple[SweepPoint, ...] = field(default_factory=tuple)
    tile_tokens: int | None = None  # SOLA §4.4.3's tile quantum, from the sweep (``find_tile``); None: not found
    scls: SclsProfile | None = None  # SCLS eq. 3/4 and the memory parameters; None in a profile without them

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["sweep"] = [asdict(p) for p in self.sweep]
        data["scls"] = self.scls.to_json() if self.scls is not None else None
        for key in ("prefill_fit_error", "decode_fit_error"):  # strict JSON has no NaN: an unknown error is null
            if math.isnan(data[key]):
                data[key] = None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> CostProfile:
        try:
            return cls(
                model=str(data["model"]),
                hardware=str(data["hardware"]),
                prefill=_build(PrefillCost, data["prefill"]),
                decode=_build(DecodeCost, data["decode"]),
                pivot_tokens=as_int(data["pivot_tokens"]),
                pivot_seconds=as_float(data["pivot_seconds"]),
                prefill_fit_error=_float_or_nan(data.get("prefill_fit_error")),
                decode_fit_error=_float_or_nan(data.get("decode_fit_error")),
                sweep=tuple(_build(SweepPoint, p) for p in _items(data.get("sweep", ()))),
                tile_tokens=_int_or_none(data.get("tile_tokens")),
                scls=_scls(data.get("scls")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"cost profile: missing or malformed field ({exc})") from exc

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"cost profile {p} does not exist: run `tetriserve profile` to write it")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"cost profile {p} is not valid JSON ({exc})") from exc
        return cls.from_json(data)


def _int_or_none(value: object) -> int | None:
    return None if value is None else as_int(value)


def _scls(value: object) -> SclsProfile | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"scls must be an object, not {type(value).__name__}")
    return SclsProfile.from_json(value)


def _float_or_nan(value: object) -> float:
    return float("nan") if value is None else as_float(value)


def _build(kind: Callable[..., _T], value: object) -> _T:
    """``kind(**value)`` of a JSON object's fields (TypeError for another value, as ``**value`` raises)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"argument after ** must be a mapping, not {type(value).__name__}")
    return kind(**value)


def _items(value: object) -> Iterable[object]:
    """A JSON array's items (TypeError for a value that is not iterable, as iterating it raises)."""
    if not isinstance(value, Iterable):
        raise TypeError(f"{type(value).__name__!r} object is not iterable")
    return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unknown"


def default_profile_path(model: str, hardware: str) -> Path:
    home = Path(os.environ.get("TETRISERVE_HOME") or "~/.cache/tetriserve").expanduser()
    return home / "profiles" / f"{_slug(Path(model).name)}--{_slug(hardware)}.json"
