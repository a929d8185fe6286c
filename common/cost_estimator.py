"""Cost models with SOLA's online correction applied: what scheduling policies ask for time estimates.

The scheduler adapter feeds every measured iteration back (``observe_prefill``,
SOLA eq. 5); policies read the corrected estimates (γ·C₀). The decode model (eq. 4)
has its own γ, fed from measured decode steps (``observe_decode``). Policies that need
one refuse to start without a profile (``tetriserve profile`` writes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tetriserve.common.cost_model import DecodeCost, OnlineCorrection, PrefillBatch, PrefillCost
from tetriserve.common.cost_profile import CostProfile, default_profile_path


class CostEstimator:
    def __init__(
        self,
        prefill: PrefillCost,
        decode: DecodeCost,
        pivot_tokens: int,
        pivot_seconds: float,
        alpha: float = 0.2,
        tile_tokens: int | None = None,
    ) -> None:
        if pivot_tokens < 1 or pivot_seconds <= 0:
            raise ValueError(f"cost profile: pivot must be positive, got {pivot_tokens} tokens / {pivot_seconds} s")
        self.prefill_base = prefill
        self.decode_base = decode
        self.pivot_tokens = pivot_tokens
        self.pivot_seconds = pivot_seconds
        self.prefill_gamma = OnlineCorrection(alpha)
        self.decode_gamma = OnlineCorrection(alpha)
        self.tile_tokens = tile_tokens  # the tile quantum the profiler measured (SOLA §4.4.3), if it found one

    @classmethod
    def from_profile(cls, profile: CostProfile, alpha: float = 0.2) -> CostEstimator:
        return cls(
            profile.prefill, profile.decode, profile.pivot_tokens, profile.pivot_seconds, alpha, profile.tile_tokens
        )

    # -- prefill -------------------------------------------------------------------------
    def prefill_time(self, batch: PrefillBatch) -> float:
        return self.prefill_gamma.gamma * self.prefill_base.predict(batch)

    def request_prefill_time(self, computed: int, remaining: int, chunk: int | None = None) -> float:
        """SOLA's Cᵖ(r), corrected."""
        return self.prefill_gamma.gamma * self.prefill_base.request_time(computed, remaining, chunk)

    def iteration_seconds(self) -> float:
        """T_max / T̄_pf: one iteration at the pivot forward size, corrected."""
        return self.prefill_gamma.gamma * self.pivot_seconds

    def observe_prefill(self, batch: PrefillBatch, seconds: float) -> float:
        """Fold one measured prefill iteration in; returns the base (uncorrected) prediction."""
        base = self.prefill_base.predict(batch)
        self.prefill_gamma.observe(base, seconds)
        return base

    # -- decode --------------------------------------------------------------------------
    def decode_time(self, context_lens: Sequence[int]) -> float:
        """SOLA's Cᵈ(Q^run) (eq. 4) of a decode iteration over requests holding ``context_lens``, corrected."""
        return self.decode_gamma.gamma * self.decode_base.predict(context_lens)

    def observe_decode(self, context_lens: Sequence[int], seconds: float) -> float:
        """Fold one measured decode iteration in (eq. 5 on the decode model); returns the base prediction."""
        base = self.decode_base.predict(context_lens)
        self.decode_gamma.observe(base, seconds)
        return base


def load_estimator(configured: str | None, model: str, hardware: str, alpha: float = 0.2) -> CostEstimator | None:
    """The cost profile at ``configured``, else this model's default one on this hardware when it exists, else
    None. A configured profile that is missing or malformed raises ValueError."""
    path = Path(configured) if configured else default_profile_path(model, hardware)
    if configured is None and not path.exists():
        return None
    return CostEstimator.from_profile(CostProfile.load(path), alpha)
