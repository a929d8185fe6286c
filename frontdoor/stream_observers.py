"""What watches a request's stream at the front door: its metrics and its span, observers of one protocol.

``FrontDoor.stream`` (``frontdoor/core.py``) turns the backend's chunks into text and tells every observer what
happened, in this order::

    first_token(ttft_s)                 the first output token left, ttft_s after the request came in
    tokens(gap_s, n)                    n more tokens left, gap_s after the ones before them
    finished(end)                       the stream ended with a finish reason (``StreamEnd``)
    failed(exc)                         the stream raised before it ended (``Overloaded``: refused at placement)
    abandoned(prompt_tokens, generated) the consumer left before the end: the client is gone
    closed(generated, exc)              always, last

Exactly one of ``finished``, ``failed`` and ``abandoned`` comes, before ``closed``. An observer that raises
fails the request's stream, as the code it replaces would have: observers are the service's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tetriserve.frontdoor.admission import Overloaded
from tetriserve.observability.request_metrics import RequestMetrics
from tetriserve.observability.request_span import RequestSpan

EndKind = Literal["backend", "unavailable", "no_finish"]


@dataclass(frozen=True)
class StreamEnd:
    """How a stream ended: ``reason`` (stop, length, abort, error), the error's text, the token counts, the
    end-to-end and first-token times; ``kind``: the backend's own finish, an error because no worker serves
    (``unavailable``), or a backend stream that ended without a finish (``no_finish``)."""

    reason: str
    error: str | None
    prompt_tokens: int
    generated: int
    e2e_s: float
    ttft_s: float | None
    kind: EndKind = "backend"


class StreamObserver(Protocol):
    def first_token(self, ttft_s: float) -> None: ...

    def tokens(self, gap_s: float, n: int) -> None: ...

    def finished(self, end: StreamEnd) -> None: ...

    def failed(self, exc: BaseException) -> None: ...

    def abandoned(self, prompt_tokens: int, generated: int) -> None: ...

    def closed(self, generated: int, exc: BaseException | None) -> None: ...


class MetricsObserver:
    """The front door's request metrics (``observability/request_metrics.py``)."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics

    def first_token(self, ttft_s: float) -> None:
        self.metrics.first_token(ttft_s)

    def tokens(self, gap_s: float, n: int) -> None:
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

    def first_token(self, ttft_s: float) -> None:
        return None

    def tokens(self, gap_s: float, n: int) -> None:
        return None

    def finished(self, end: StreamEnd) -> None:
        self.span.finished(end.reason, end.error, None if end.ttft_s is None else end.ttft_s * 1e3)

    def failed(self, exc: BaseException) -> None:
        return None

    def abandoned(self, prompt_tokens: int, generated: int) -> None:
        return None

    def closed(self, generated: int, exc: BaseException | None) -> None:
        self.span.close(generated, exc)
