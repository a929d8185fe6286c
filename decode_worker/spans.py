"""A decode worker's spans of one request (issue #17, part 6; the tree is in ``common/tracing.py``).

    take / adopt       tetriserve.decode            open(): under ``Request.trace`` (a sibling of the prefill's)
                         tetriserve.decode.admission    first_token(): take → its first token here (the
                                                        engine's admission, waiting for and loading the KV)
                         tetriserve.kv.load             the KV connector, on the engine thread (``link_key``)
                         tetriserve.decode.run          close(): first token → finish, or the slice move away

The engine's deltas reach the worker as callbacks, outside the task of any call, so the spans live on the
request's ``Running`` entry and are ended explicitly. Off, every request shares ``NO_SPANS``, whose
methods do nothing.
"""

from __future__ import annotations

from tetriserve.common import log_context, tracing
from tetriserve.common.request import Request


class DecodeSpans:
    """Tracing off: nothing is recorded (the shared ``NO_SPANS``)."""

    span: tracing.Span = tracing.INVALID_SPAN

    @staticmethod
    def open(worker_id: str, req: Request, generated: int) -> DecodeSpans:
        """The request arrived here with ``generated`` output tokens (the prefill's, a migrated request's)."""
        log_context.bind(req.request_id, req.trace)  # the rest of the take / adopt call
        if not tracing.enabled():
            return NO_SPANS
        return _Recording(worker_id, req, generated)

    def first_token(self) -> None:
        return

    def close(self, tokens: int, reason: str | None, error: str | None, moved_to: str | None = None) -> None:
        return


class _Recording(DecodeSpans):
    def __init__(self, worker_id: str, req: Request, generated: int) -> None:
        self.generated = generated
        attributes: tracing.Attrs = {
            "tetriserve.request_id": req.request_id,
            "tetriserve.worker": worker_id,
            "tetriserve.attempt": req.attempt,
            "tetriserve.prompt_tokens": len(req.prompt_token_ids),
            "tetriserve.generated_before": generated,
        }
        self.span = tracing.start("tetriserve.decode", req.trace, attributes)
        self.taken = tracing.now_ns()
        self.decoding: int | None = None

    def first_token(self) -> None:
        self.decoding = tracing.now_ns()
        tracing.record("tetriserve.decode.admission", self.span, self.taken, end_ns=self.decoding)

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
