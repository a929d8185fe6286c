"""An in-memory OTLP/gRPC trace collector: the shared integration cluster exports to it, and the tracing tests read
the spans the way they reach Jaeger, with no test-only hook in the actors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Exported:
    name: str
    process: str  # the resource's tetriserve.process
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver keeping every span in memory."""

    def __init__(self) -> None:
        self.endpoint = ""  # host:port, once it serves
        self.spans: list[Exported] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        attributes = {a.key: _value(a.value) for a in s.attributes}
                        self.spans.append(
                            Exported(
                                s.name,
                                resource.get("tetriserve.process", ""),
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                attributes,
                            )
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Exported]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@contextmanager
def running_collector() -> Iterator[Collector]:
    """A collector serving on a free local port (its ``endpoint``)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    receiver = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    receiver.endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        yield receiver
    finally:
        server.stop(None)
