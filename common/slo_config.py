"""The ``slo`` section: the service's latency objectives for requests that name none, by class of request.

A request's SLO is what it asks for (the OpenAI body's ``slo`` extension, gRPC's ``SLO`` message), field by
field; a field it leaves out comes from the first class its prompt fits (``max_prompt_tokens``), else from the
section's own defaults. The policies that read SLOs (AccelGen's remaining time and dynamic chunking, SOLA's
orders, CacheOpt's TBT slack and preemption order) then see one on every request the operator gave one for.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tetriserve.common.request import SLO

# AccelGen §4.3: a token every 0.1875 s, the normal reading speed, is the TBT SLO of a request that names none;
# the decode admission policy ``accelgen`` applies it where neither the request nor this section gives one
READING_TBT_MS = 187.5

_TTFT = "Time-to-first-token objective, ms (None: none)."
_TBT = "Time-between-tokens objective, ms (None: none)."
_JCT = "Job-completion-time objective, ms (None: none)."


class SloClass(BaseModel):
    """The objectives of the requests whose prompts have at most ``max_prompt_tokens`` tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_prompt_tokens: int = Field(ge=1, description="The longest prompt of the class, in tokens.")
    ttft_ms: float | None = Field(None, gt=0, description=_TTFT)
    tbt_ms: float | None = Field(None, gt=0, description=_TBT)
    jct_ms: float | None = Field(None, gt=0, description=_JCT)


class SloConfig(BaseModel):
    """Server-side SLO defaults; a request's own objectives win, field by field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: float | None = Field(None, gt=0, description=_TTFT + " For a request in no class.")
    tbt_ms: float | None = Field(None, gt=0, description=_TBT + " For a request in no class.")
    jct_ms: float | None = Field(None, gt=0, description=_JCT + " For a request in no class.")
    classes: tuple[SloClass, ...] = Field(
        (),
        description=(
            "Classes of request by prompt length, each with its objectives: a request takes the first class its "
            "prompt fits, e.g. [{max_prompt_tokens: 512, ttft_ms: 500}, {max_prompt_tokens: 4096, ttft_ms: 3000}]."
        ),
    )

    def for_request(self, prompt_tokens: int, asked: SLO) -> SLO:
        """``asked`` with each field it leaves out taken from the class of a ``prompt_tokens``-token prompt."""
        source: SloClass | SloConfig = next((c for c in self.classes if prompt_tokens <= c.max_prompt_tokens), self)
        return SLO(
            ttft_ms=asked.ttft_ms if asked.ttft_ms is not None else source.ttft_ms,
            tbt_ms=asked.tbt_ms if asked.tbt_ms is not None else source.tbt_ms,
            jct_ms=asked.jct_ms if asked.jct_ms is not None else source.jct_ms,
        )
