"""A decode worker's spans of one request (the tree is in ``observability/tracing.py``).

    take / adopt       tetriserve.decode            open(): under ``Request.trace`` (a sibling of the prefill's),
                                                    from the take's arrival
                         tetriserve.decode.admission    first_token(): take → its first token here (the
                                                        engine's admission, waiting for and loading the KV), of which
                           tetriserve.decode.pull_wait      take → its pulled KV has landed (a pull only)
                           tetriserve.decode.engine_queue   queued() → the engine thread added it (``on_added``:
                                                            the step in progress ended first)
                           tetriserve.decode.first_step     added → its first token here (the first step, the KV
                                                            copied in within it, the delta's way to the worker)
                         tetriserve.kv.load             the KV connector, on the engine thread (``link_key``)
                         tetriserve.decode.run          close(): first token → finish, or the slice move away

The engine's deltas reach the worker as callbacks, outside the task of any call, so the spans live on the
request's ``Running`` entry and are ended explicitly. Off, every request shares ``NO_SPANS``, whose
methods do nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from tetriserve.common import log_context
from tetriserve.common.request import Request
from tetriserve.observability import tracing


class DecodeSpans:
    """Tracing off: nothing is recorded (the shared ``NO_SPANS``)."""

    span: tracing.Span = tracing.INVALID_SPAN
    on_added: Callable[[], None] | None = None  # the engine loop's hook (``EngineLoop.add``); None: none

    @staticmethod
    def open(
        worker_id: str, req: Request, generated: int, arrived_ns: int | None = None, pulled: bool = False
    ) -> DecodeSpans:
        """The request arrived here with ``generated`` output tokens (the prefill's, a migrated request's), at
        ``arrived_ns`` (None: now); ``pulled``: it then waited for its pulled KV to land until now."""
        log_context.bind(req.request_id, req.trace)  # the rest of the take / adopt call
        if not tracing.enabled():
            return NO_SPANS
        return _Recording(worker_id, req, generated, arrived_ns, pulled)

    def queued(self) -> None:
        """Handed to the engine thread's queue now."""
        return

    def first_token(self) -> None:
        return

    def close(self, tokens: int, reason: str | None, error: str | None, moved_to: str | None = None) -> None:
        return


class _Recording(DecodeSpans):
    def __init__(self, worker_id: str, req: Request, generated: int, arrived_ns: int | None, pulled: bool) -> None:
        self.generated = generated
        attributes: tracing.Attrs = {
            "tetriserve.request_id": req.request_id,
            "tetriserve.worker": worker_id,
            "tetriserve.attempt": req.attempt,
            "tetriserve.prompt_tokens": len(req.prompt_token_ids),
            "tetriserve.generated_before": generated,
        }
        self.taken = tracing.now_ns() if arrived_ns is None else arrived_ns
        self.span = tracing.start("tetriserve.decode", req.trace, attributes, start_ns=self.taken)
        if pulled:
            tracing.record("tetriserve.decode.pull_wait", self.span, self.taken)
        self.decoding: int | None = None
        self.queued_ns: int | None = None
        self.added_ns: int | None = None  # set on the engine thread
        self.on_added = self._added

    def queued(self) -> None:
        self.queued_ns = tracing.now_ns()

    def _added(self) -> None:
        self.added_ns = tracing.now_ns()

    def first_token(self) -> None:
        self.decoding = tracing.now_ns()
        tracing.record("tetriserve.decode.admission", self.span, self.taken, end_ns=self.decoding)
        added = self.added_ns
        if self.queued_ns is not None and added is not None:
            tracing.record("tetriserve.decode.engine_queue", self.span, self.queued_ns, end_ns=added)
            tracing.record("tetriserve.decode.first_step", self.span, added, end_ns=self.decoding)

    def close(self, tokens: int, reason: str | None, error: str | None, moved_to: str | None = None) -> None:
        if not self.span.is_recording():
            return
        if self.decoding is not None:
            run: tracing.Attrs = {"tetriserve.output_tokens": tokens - self.generated}
            tracing.record("tetriserve.decode.run", self.span, self.decoding, run, error)
        attributes: tracing.Attrs = {"tetriserve.output_tokens": tokens, "tetriserve.finish_reason": reason or ""}
        if moved_to is not None:
            attributes["tetriserve.moved_to"] = moved_to
        tracing.end(self.span, attributes, error if reason == "error" else None)


NO_SPANS = DecodeSpans()
