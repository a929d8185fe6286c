"""What watches a request's stream at the front door: its metrics, its span and its line in the request trace,
observers of one protocol.

``FrontDoor.stream`` (``frontdoor/core.py``) turns the backend's chunks into text and tells every observer what
happened, in this order::

    first_token(ttft_s, n, worker)      the first n output tokens left, ttft_s after the request came in
    tokens(gap_s, n, worker)            n more tokens left, gap_s after the ones before them
    finished(end)                       the stream ended with a finish reason (``StreamEnd``)
    failed(exc)                         the stream raised before it ended (``Overloaded``: refused at placement)
    abandoned(prompt_tokens, generated) the consumer left before the end: the client is gone
    closed(generated, exc)              always, last

``worker`` names the worker that produced the tokens. Exactly one of ``finished``, ``failed`` and ``abandoned``
comes, before ``closed``. An observer that raises
fails the request's stream, as the code it replaces would have: observers are the service's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tetriserve.frontdoor.admission import Overloaded
from tetriserve.observability.request_metrics import RequestMetrics
from tetriserve.observability.request_span import RequestSpan
from tetriserve.observability.request_trace import RequestTrace, TraceRecord

EndKind = Literal["backend", "unavailable", "no_finish"]


@dataclass(frozen=True)
class StreamEnd:
    """How a stream ended: ``reason`` (stop, length, abort, error), the error's text, the token counts, the
    end-to-end and first-token times; ``kind``: the backend's own finish, an error because no worker serves
    (``unavailable``), or a backend stream that ended without a finish (``no_finish``); ``metrics``: the last
    chunk's per-request figures (the length estimate)."""

    reason: str
    error: str | None
    prompt_tokens: int
    generated: int
    e2e_s: float
    ttft_s: float | None
    kind: EndKind = "backend"
    metrics: Mapping[str, float] = field(default_factory=dict)


class StreamObserver(Protocol):
    def first_token(self, ttft_s: float, n: int, worker: str) -> None: ...

    def tokens(self, gap_s: float, n: int, worker: str) -> None: ...

    def finished(self, end: StreamEnd) -> None: ...

    def failed(self, exc: BaseException) -> None: ...

    def abandoned(self, prompt_tokens: int, generated: int) -> None: ...

    def closed(self, generated: int, exc: BaseException | None) -> None: ...


class MetricsObserver:
    """The front door's request metrics (``observability/request_metrics.py``)."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics

    def first_token(self, ttft_s: float, n: int, worker: str) -> None:
        self.metrics.first_token(ttft_s)

    def tokens(self, gap_s: float, n: int, worker: str) -> None:
        self.metrics.tokens(gap_s, n)

    def finished(self, end: StreamEnd) -> None:
        if end.kind == "no_finish":
            self.metrics.errored("no_finish")
        else:
            self.metrics.finished(end.reason, end.prompt_tokens, end.generated, end.e2e_s, end.ttft_s, end.kind)

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, Overloaded):
            self.metrics.refused("placement")
        else:
            self.metrics.errored("backend_unavailable" if isinstance(exc, ConnectionError) else "internal")

    def abandoned(self, prompt_tokens: int, generated: int) -> None:
        self.metrics.aborted("disconnect", prompt_tokens, generated)

    def closed(self, generated: int, exc: BaseException | None) -> None:
        return None


class SpanObserver:
    """The request's root span (``observability/request_span.py``)."""

    def __init__(self, span: RequestSpan) -> None:
        self.span = span

    def first_token(self, ttft_s: float, n: int, worker: str) -> None:
        return None

    def tokens(self, gap_s: float, n: int, worker: str) -> None:
        return None

    def finished(self, end: StreamEnd) -> None:
        self.span.finished(end.reason, end.error, None if end.ttft_s is None else end.ttft_s * 1e3)

    def failed(self, exc: BaseException) -> None:
        return None

    def abandoned(self, prompt_tokens: int, generated: int) -> None:
        return None

    def closed(self, generated: int, exc: BaseException | None) -> None:
        self.span.close(generated, exc)


class TraceObserver:
    """The request's line in the request trace (``observability/request_trace.py``), written when it closes."""

    def __init__(self, trace: RequestTrace, record: TraceRecord) -> None:
        self.trace, self.record = trace, record
        self.at_s = 0.0  # when the latest tokens left, after the request came in
        self.outcome = "abandoned"  # until the stream is heard to finish or fail
        self.end: StreamEnd | None = None
        self.error: str | None = None

    def first_token(self, ttft_s: float, n: int, worker: str) -> None:
        self.at_s = ttft_s
        self.record.deltas.append((ttft_s, n))
        self.record.saw(worker)

    def tokens(self, gap_s: float, n: int, worker: str) -> None:
        self.at_s += gap_s
        self.record.deltas.append((self.at_s, n))
        self.record.saw(worker)

    def finished(self, end: StreamEnd) -> None:
        self.outcome, self.end, self.error = "finished", end, end.error

    def failed(self, exc: BaseException) -> None:
        self.outcome, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def abandoned(self, prompt_tokens: int, generated: int) -> None:
        return None

    def closed(self, generated: int, exc: BaseException | None) -> None:
        end = self.end
        line = self.record.line(
            self.outcome,
            generated,
            finish_reason=None if end is None else end.reason,
            error=self.error,
            ttft_s=self.record.deltas[0][0] if self.record.deltas else None,
            e2e_s=None if end is None else end.e2e_s,
            metrics=None if end is None else dict(end.metrics),
        )
        self.trace.write(line)
