"""A prefill worker's spans of one request (the tree is in ``observability/tracing.py``).

    _serve task     tetriserve.prefill          open_prefill: under ``Request.trace``, current for the task
                      tetriserve.prefill.queue        queued(): raw queue until its PrefillSchedBatch turn
                      tetriserve.prefill.compute      computed(): the engine's chunked prefill → first token
                      tetriserve.length_prediction    predicted(): submit → the estimate the handoff takes
                      tetriserve.kv.send              sending(): send → acknowledged or failed (bytes, backend)

The handoff's decode worker and dispatch policy are attributes of ``tetriserve.prefill``; the request's log
lines carry its id from ``open_prefill`` on (``common/log_context.py``). All of it costs one check per call
when tracing is off.
"""

from __future__ import annotations

from tetriserve.common import log_context
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request
from tetriserve.observability import tracing
from tetriserve.transport.registry import backend_of


def open_prefill(worker_id: str, req: Request) -> tracing.Span:
    """The request's span on this worker, made current for the calling task (its own, per request)."""
    log_context.bind(req.request_id, req.trace)
    if not tracing.enabled():
        return tracing.INVALID_SPAN
    attributes: tracing.Attrs = {
        "tetriserve.request_id": req.request_id,
        "tetriserve.worker": worker_id,
        "tetriserve.attempt": req.attempt,
        "tetriserve.prompt_tokens": len(req.prompt_token_ids),
        "tetriserve.resumed_tokens": len(req.resume),
    }
    span = tracing.start("tetriserve.prefill", req.trace, attributes)
    tracing.enter(span)
    return span


def queued(since_ns: int, batch_seq: int) -> int:
    """The raw-queue wait is over (its batch's turn came); returns when the compute starts."""
    now = tracing.now_ns()
    attributes: tracing.Attrs = {"tetriserve.batch_seq": batch_seq}
    tracing.record("tetriserve.prefill.queue", None, since_ns, attributes, end_ns=now)
    return now


def computed(since_ns: int, tokens: tuple[int, ...], finish_reason: str | None) -> None:
    attributes: tracing.Attrs = {
        "tetriserve.output_tokens": len(tokens),
        "tetriserve.finish_reason": finish_reason or "",
    }
    tracing.record("tetriserve.prefill.compute", None, since_ns, attributes)


def predicted(since_ns: int, estimate: LengthEstimate | None, late: bool) -> None:
    """The estimate the handoff goes with (``late``: the prediction was not ready; it follows the request)."""
    if not tracing.enabled():
        return
    attributes: tracing.Attrs = {"tetriserve.length.late": late}
    if estimate is not None:
        attributes.update(
            {
                "tetriserve.length.estimate": estimate.estimate,
                "tetriserve.length.lower": estimate.lower,
                "tetriserve.length.upper": estimate.upper,
                "tetriserve.length.bucket": estimate.bucket,
                "tetriserve.length.confidence": estimate.confidence,
                "tetriserve.length.source": estimate.source,
            }
        )
    tracing.record("tetriserve.length_prediction", None, since_ns, attributes)


def sending(spans: dict[str, tracing.Span], key: str, since_ns: int, nbytes: int, address: str, dst: str) -> None:
    """Start the span of a KV send (ended by whoever sees its handle complete)."""
    if not tracing.enabled():
        return
    attributes: tracing.Attrs = {
        "tetriserve.kv.key": key,
        "tetriserve.kv.bytes": nbytes,
        "tetriserve.kv.backend": backend_of(address),
        "tetriserve.decode_worker": dst,
    }
    spans[key] = tracing.start("tetriserve.kv.send", None, attributes, start_ns=since_ns)
