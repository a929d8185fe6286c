"""Output-length estimates that travel with each request.

TetriInfer §3.3.2 predicts a *range* (bucket) of generated tokens rather than an
exact count; schedulers use ``lower``/``upper`` for reservation decisions and
``estimate`` for ordering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from tetriserve.common.coerce import as_float, as_int


@dataclass(frozen=True)
class LengthEstimate:
    """Predicted number of generated tokens for one request.

    Attributes:
        lower: lower end of the predicted range (tokens, inclusive).
        estimate: point estimate used for ordering.
        upper: upper end of the predicted range (tokens, exclusive).
        bucket: index of the predicted bucket (``-1`` when the predictor has no buckets).
        confidence: the predictor's confidence in the range, in [0, 1].
        source: name of the predictor that produced the estimate.
    """

    lower: int
    estimate: int
    upper: int
    bucket: int = -1
    confidence: float = 0.0
    source: str = "unknown"

    def __post_init__(self) -> None:
        if not 0 <= self.lower <= self.estimate <= self.upper:
            raise ValueError(
                f"LengthEstimate needs 0 <= lower <= estimate <= upper, got "
                f"lower={self.lower} estimate={self.estimate} upper={self.upper}"
            )
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"LengthEstimate.confidence must be in [0, 1], got {self.confidence}")

    def is_heavy(self, threshold_tokens: int) -> bool:
        """A *heavy* decode in TetriInfer's sense (§2.2.3): predicted to generate many tokens."""
        return self.estimate >= threshold_tokens

    def after(self, generated: int) -> LengthEstimate:
        """The estimate of what is still to come once ``generated`` tokens are out (a request that moves)."""
        if generated <= 0:
            return self
        return replace(
            self,
            lower=max(0, self.lower - generated),
            estimate=max(0, self.estimate - generated),
            upper=max(0, self.upper - generated),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "lower": self.lower,
            "estimate": self.estimate,
            "upper": self.upper,
            "bucket": self.bucket,
            "confidence": self.confidence,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> LengthEstimate:
        return cls(
            lower=as_int(data["lower"]),
            estimate=as_int(data["estimate"]),
            upper=as_int(data["upper"]),
            bucket=as_int(data.get("bucket", -1)),
            confidence=as_float(data.get("confidence", 0.0)),
            source=str(data.get("source", "unknown")),
        )


@dataclass(frozen=True)
class PredictInput:
    """What a length predictor sees of a request.

    Attributes:
        prompt_len: prompt length in target-model tokens.
        max_tokens: the request's output cap.
        prompt_token_ids: the prompt in target-model token ids (text models decode them); may be empty
            when a caller only knows lengths.
    """

    prompt_len: int
    max_tokens: int
    prompt_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            raise ValueError(f"PredictInput.prompt_len must be >= 0, got {self.prompt_len}")
        if self.max_tokens < 0:
            raise ValueError(f"PredictInput.max_tokens must be >= 0, got {self.max_tokens}")


class LengthPredictor(Protocol):
    """Served inside each prefill worker (TetriInfer §3.3.2, parallel mode)."""

    name: str

    def predict(self, batch: Sequence[PredictInput]) -> list[LengthEstimate]: ...

    def instant(self, item: PredictInput) -> LengthEstimate:
        """An estimate that costs next to nothing (no model), for a request whose ``predict`` would come too
        late to be of use (the prefill worker's ``PredictionQueue``)."""
        ...

    def observe(self, prompt_len: int, output_len: int) -> None:
        """Feed back a finished request's true output length (online predictors learn from it)."""
        ...

    def warm_up(self) -> None:
        """Load whatever the first ``predict`` would (called once when the prefill worker starts)."""
        ...
