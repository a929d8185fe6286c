"""The ``tracing`` section of the cluster config: OpenTelemetry spans of each request.

Off by default. On, every process of the service (each front door, the GlobalScheduler, every worker)
exports its spans over OTLP to ``endpoint`` (``observability/tracing.py``)::

    tracing: {enabled: true, endpoint: http://jaeger:4317, protocol: grpc, service_name: tetriserve, sample_ratio: 1.0}

Unset fields fall back to the standard OpenTelemetry environment variables where the SDK reads them
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_BSP_*``); ``OTEL_SDK_DISABLED=true`` turns tracing off whatever the config says.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TracingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False,
        description="Record OpenTelemetry spans of each request (front door, placement, prefill, KV transfer, decode).",
    )
    endpoint: str | None = Field(
        None,
        description=(
            "OTLP collector to export to: host:port or a URL (grpc: http://host:4317; http: http://host:4318, the "
            "/v1/traces path is added). None: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / $OTEL_EXPORTER_OTLP_ENDPOINT, "
            "else the SDK's default (localhost:4317 / :4318). A bare host:port is plain text; https:// uses TLS. "
            "`serve --otlp-endpoint` turns tracing on too, unless --no-tracing is given."
        ),
    )
    protocol: Literal["grpc", "http"] = Field("grpc", description="OTLP transport: grpc (protobuf) or http (protobuf).")
    service_name: str | None = Field(
        None, description="`service.name` of every span's resource; None: $OTEL_SERVICE_NAME, else `tetriserve`."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description=(
            "Share of requests traced, decided once at the front door (the workers follow its decision through "
            "the propagated traceparent; a client's own sampled traceparent is followed too)."
        ),
    )
