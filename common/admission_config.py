"""The ``admission`` section of the cluster config: backpressure at the front doors and per prefill worker."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

RETRY_AFTER_MAX_S = 60  # the longest Retry-After a refusal names (front door and GlobalScheduler alike)


class AdmissionConfig(BaseModel):
    """Backpressure at each front door (frontdoor/admission.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_wait_s: float = Field(
        30.0,
        gt=0,
        description=(
            "A request is admitted only if it is expected to start decoding within this many seconds (requests "
            "waiting / the service's measured start rate); the excess is refused at once: HTTP 429 with "
            "Retry-After, gRPC RESOURCE_EXHAUSTED."
        ),
    )
    min_queue: int = Field(
        256,
        ge=1,
        description="Requests that may wait to start whatever the bound says (before any rate is measured, too).",
    )
    max_inflight: int = Field(4096, ge=1, description="Backstop: most requests admitted and not finished.")
    max_queued_per_worker: int = Field(
        1024,
        ge=1,
        description=(
            "Backstop per prefill worker: most requests placed on it and not yet past prefill. Beside it the "
            "GlobalScheduler places a request only on a prefill worker whose queue it would wait behind for at "
            "most max_wait_s (the worker's reported queue_wait_s, prefill_worker/pace.py)."
        ),
    )
