"""`serve`'s tracing flags: they override the config file's ``tracing`` section.

--otlp-endpoint URL        export spans there (turns tracing on)
--otlp-protocol P          grpc (default) | http
--trace-sample-ratio R     share of requests traced (0..1)
--tracing / --no-tracing   on with the default (or $OTEL_EXPORTER_OTLP_*) endpoint, or off whatever is set
"""

from __future__ import annotations

import argparse
from typing import Any


def add_tracing_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OpenTelemetry collector for request spans, e.g. http://localhost:4317 (turns tracing on)",
    )
    parser.add_argument("--otlp-protocol", choices=("grpc", "http"), default=None, help="OTLP transport (default grpc)")
    parser.add_argument("--trace-sample-ratio", type=float, default=None, help="share of requests traced (default 1.0)")
    parser.add_argument(
        "--tracing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="request spans over OTLP (default: off, or the config's tracing.enabled)",
    )


def tracing_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted ``ClusterConfig`` overrides (None: not given) from the flags above."""
    enabled = args.tracing
    if enabled is None and args.otlp_endpoint is not None:
        enabled = True
    return {
        "tracing.enabled": enabled,
        "tracing.endpoint": args.otlp_endpoint,
        "tracing.protocol": args.otlp_protocol,
        "tracing.sample_ratio": args.trace_sample_ratio,
    }
