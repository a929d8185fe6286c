"""OpenTelemetry spans of one request across the service's processes; off unless configured.

    front door       tetriserve.request  (root, SERVER: route, request id, model, tokens, finish reason)
                        │ traceparent ─▶ Request.trace, PlacementRequest.trace (W3C strings in typed fields)
    GlobalScheduler     ├─ tetriserve.place
    prefill worker      ├─ tetriserve.prefill ─┬─ tetriserve.prefill.queue        raw queue → its batch's turn
                        │                      ├─ tetriserve.prefill.compute      the engine's prefill
                        │                      ├─ tetriserve.length_prediction    submit → the estimate handed off
                        │                      └─ tetriserve.kv.send              send → acknowledged (bytes, backend)
    decode worker       └─ tetriserve.decode ──┬─ tetriserve.decode.admission     take → first token here, split in
                                               ├─ tetriserve.decode.pull_wait       take → a pulled KV landed
                                               ├─ tetriserve.decode.engine_queue    → the engine thread has it
                                               ├─ tetriserve.decode.first_step      → its first token here
                                               ├─ tetriserve.kv.load              engine thread: KV copied in
                                               └─ tetriserve.decode.run           first token → finish

Context crosses processes only as a W3C ``traceparent`` string carried by our own typed messages, never
through Ray's tracing. A ``parent`` is such a string, a span of this process, or None: the current span
(``enter`` makes a span current for the rest of an asyncio task).

Each process calls ``setup(config.tracing, process)`` once: the front doors in ``run_front_doors``, every
actor in its constructor. Off (the default), ``start`` returns OTel's shared non-recording ``INVALID_SPAN``
after one module-global check, ``record`` returns at once and ``traceparent`` is None: nothing is allocated
or exported. On, spans go through a ``BatchSpanProcessor`` to OTLP (grpc or http), sampled at the front door
(``ParentBased(TraceIdRatioBased(sample_ratio))``; the workers follow the traceparent's sampled flag).

The engine thread knows requests by KV key only: the decode worker ``link_key``s a key to its span, and the
KV connector takes it back (``key_parent``) when it loads that key.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN as INVALID_SPAN
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags
from opentelemetry.trace import Span as Span
from opentelemetry.trace import SpanKind as SpanKind
from opentelemetry.util.types import Attributes

from tetriserve.common import log_context
from tetriserve.common.tracing_config import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)

Parent = str | Span | None
Attrs = dict[str, str | bool | int | float | list[str]]  # what our spans carry
KEY_MEMORY = 4096  # KV keys linked to a span and not loaded yet (a load that never comes is forgotten)

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_lock = threading.Lock()
_tracer: trace.Tracer | None = None  # None: tracing is off in this process
_provider: TracerProvider | None = None
_configured: tuple[object, ...] | None = None
_keys: OrderedDict[str, Span] = OrderedDict()


# -- setup -------------------------------------------------------------------------------------------------------
def setup(config: TracingConfig | None, process: str, exporter: SpanExporter | None = None) -> bool:
    """Set up this process's tracer from ``config`` (the same call again is a no-op; another config replaces
    the last). ``process`` names it in the spans' resource (``frontdoor``, ``prefill-0``, ...). ``exporter``
    (tests): spans go there at once instead of OTLP. Returns whether tracing is on."""
    global _tracer, _provider, _configured
    key = (config, process, id(exporter))
    with _lock:
        if key == _configured:
            return _tracer is not None
        _shutdown_locked()
        _configured = key
        if config is None or not config.enabled or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        service = config.service_name or os.environ.get("OTEL_SERVICE_NAME") or "tetriserve"
        resource = Resource.create(
            {
                "service.name": service,
                "service.instance.id": f"{process}@{socket.gethostname()}:{os.getpid()}",
                "tetriserve.process": process,
            }
        )
        provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            provider.add_span_processor(BatchSpanProcessor(otlp_exporter(config)))
        _provider, _tracer = provider, provider.get_tracer("tetriserve")
    logger.info("tracing on in %s: OTLP/%s to %s", process, config.protocol, config.endpoint or "the default endpoint")
    return True


def setup_process(config: TracingConfig | None, process: str) -> bool:
    """An actor's start: its log lines show the request they belong to (``log_context``), and its tracer."""
    log_context.configure_process()
    return setup(config, process)


def otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP exporter ``config`` asks for (a bare ``host:port`` is plain text; ``https://`` is TLS)."""
    endpoint = config.endpoint
    url = None if endpoint is None else (endpoint if "://" in endpoint else f"http://{endpoint}")
    if config.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        if url is not None and url.split("://", 1)[1].rstrip("/").count("/") == 0:  # no path: the standard one
            url = url.rstrip("/") + "/v1/traces"
        return HttpExporter(endpoint=url)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=url)


def shutdown() -> None:
    """Flush and stop this process's tracer (tracing is off afterwards; ``setup`` may turn it on again)."""
    global _configured
    with _lock:
        _shutdown_locked()
        _configured = None


def _shutdown_locked() -> None:
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None
    _keys.clear()


def force_flush(timeout_ms: int = 5000) -> bool:
    provider = _provider
    return True if provider is None else provider.force_flush(timeout_ms)


def enabled() -> bool:
    return _tracer is not None


# -- spans -------------------------------------------------------------------------------------------------------
def now_ns() -> int:
    """A span timestamp (wall clock, ns)."""
    return time.time_ns()


def start(
    name: str,
    parent: Parent = None,
    attributes: Attributes = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    start_ns: int | None = None,
) -> Span:
    """A started span under ``parent`` (end it with ``end``); ``INVALID_SPAN`` when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return INVALID_SPAN
    return tracer.start_span(name, _context(parent), kind, attributes, start_time=start_ns)


def end(span: Span, attributes: Attributes = None, error: str | None = None, end_ns: int | None = None) -> None:
    """Set ``attributes`` (and an error status, when ``error``) on ``span`` and end it."""
    if not span.is_recording():
        return
    if attributes:
        span.set_attributes(attributes)
    if error:
        span.set_status(StatusCode.ERROR, error)
    span.end(end_ns)


def record(
    name: str,
    parent: Parent,
    start_ns: int,
    attributes: Attributes = None,
    error: str | None = None,
    end_ns: int | None = None,
) -> None:
    """A span that began at ``start_ns`` and ends now (or at ``end_ns``), in one call."""
    if _tracer is None:
        return
    end(start(name, parent, attributes, start_ns=start_ns), None, error, end_ns)


def annotate(attributes: Attributes) -> None:
    """Set ``attributes`` on the current span (a no-op without one, or when tracing is off)."""
    if _tracer is not None and attributes:
        trace.get_current_span().set_attributes(attributes)


def enter(span: Span) -> None:
    """Make ``span`` the current one for the rest of this asyncio task (call it first in a task of the request's
    own: the task's context ends with it, so nothing is detached)."""
    if _tracer is not None:
        otel_context.attach(trace.set_span_in_context(span))


def _context(parent: Parent) -> otel_context.Context | None:
    if parent is None:
        return None  # the current context
    if isinstance(parent, str):
        remote = parse_traceparent(parent)
        if remote is None:
            return otel_context.Context()  # a root span, not a child of whatever is current here
        return trace.set_span_in_context(NonRecordingSpan(remote))
    return trace.set_span_in_context(parent)


# -- W3C traceparent ---------------------------------------------------------------------------------------------
def traceparent(span: Span) -> str | None:
    """``span``'s W3C traceparent (``00-<trace id>-<span id>-<flags>``), None for an invalid span (tracing off)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The remote span context of a W3C traceparent; None when ``value`` is not a valid one."""
    match = _TRACEPARENT.match(value.strip().lower()) if value else None
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match.group(4), 16)))


# -- the engine thread's view: KV keys ---------------------------------------------------------------------------
def link_key(key: str, span: Span) -> None:
    """The KV arriving under ``key`` belongs to ``span`` (the KV connector's load span goes under it)."""
    if _tracer is None or not span.is_recording():
        return
    with _lock:
        _keys[key] = span
        while len(_keys) > KEY_MEMORY:
            _keys.popitem(last=False)


def key_parent(key: str) -> Span | None:
    """The span ``key`` was linked to (once: the link is taken), or None."""
    if _tracer is None:
        return None
    with _lock:
        return _keys.pop(key, None)
