"""The front door's root span of one request, ``tetriserve.request`` (``observability/tracing.py``).

    FrontDoor.stream(request, route=...)
        span = RequestSpan(request, model, route, started)   from the gateway's receipt of the request; under
                                                              the client's traceparent (``request.trace``) if it
                                                              sent one; ``request.trace`` becomes this span's,
                                                              which every process the request crosses continues;
                                                              the request id is bound to this task's log lines
        span.finished(reason, error)                          the last delta's finish reason
        span.close(output_tokens, exc)                        usage, outcome, status; ends the span

Attributes: ``tetriserve.route`` (``POST /v1/completions``, ``/tetriserve.v1.TetriServe/Generate``),
``tetriserve.request_id``, ``gen_ai.request.model``, ``gen_ai.request.max_tokens``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``, ``tetriserve.ttft_ms``;
the status is ERROR for an ``error`` finish or an exception (``Overloaded``, ``ConnectionError``), with its
message. A stream the client left before its end has no finish reason and ``tetriserve.outcome=client_gone``.
"""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind

from tetriserve.common import log_context
from tetriserve.common.request import Request
from tetriserve.observability import tracing


class RequestSpan:
    def __init__(self, request: Request, model: str, route: str, started: float) -> None:
        """``started``: ``time.monotonic()`` when the gateway received the request."""
        self.reason: str | None = None
        self.error: str | None = None
        self.ttft_ms: float | None = None
        if request.trace is not None and tracing.parse_traceparent(request.trace) is None:
            request.trace = None  # a client's malformed traceparent goes no further
        if tracing.enabled():
            attributes: tracing.Attrs = {
                "tetriserve.route": route,
                "tetriserve.request_id": request.request_id,
                "gen_ai.request.model": model,
                "gen_ai.request.max_tokens": request.sampling.max_tokens,
                "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
            }
            start_ns = time.time_ns() - int((time.monotonic() - started) * 1e9)
            name = "tetriserve.request"
            self.span = tracing.start(name, request.trace, attributes, kind=SpanKind.SERVER, start_ns=start_ns)
            request.trace = tracing.traceparent(self.span) or request.trace
        else:
            self.span = tracing.start("")  # the shared non-recording span
        log_context.bind(request.request_id, request.trace)

    def finished(self, reason: str | None, error: str | None, ttft_ms: float | None) -> None:
        self.reason, self.error, self.ttft_ms = reason, error, ttft_ms

    def close(self, output_tokens: int, exc: BaseException | None = None) -> None:
        if not self.span.is_recording():
            return
        error = self.error if self.reason == "error" else None
        if exc is not None:
            self.span.record_exception(exc)
            error = f"{type(exc).__name__}: {exc}"
        attributes: tracing.Attrs = {"gen_ai.usage.output_tokens": output_tokens}
        if self.reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [self.reason]
        elif exc is None:
            attributes["tetriserve.outcome"] = "client_gone"
        if self.ttft_ms is not None:
            attributes["tetriserve.ttft_ms"] = round(self.ttft_ms, 3)
        tracing.end(self.span, attributes, error)
