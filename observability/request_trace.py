"""The request trace: one JSON line per request a front door served, the workload and outcomes of a run.

With ``request_trace`` set (``tetriserve serve --request-trace PATH``), each front door process appends a line to
that file when a request's stream closes. A line holds what the policies were given and what came of it, so a
run can be studied afterwards or replayed (arrivals, sizes, SLOs and priorities are a workload; the outcomes
are what a replay is compared with)::

    {"v": 1, "id": "cmpl-…", "route": "/v1/completions", "arrival": 1764860000.123,   wall clock, seconds
     "prompt_tokens": 812, "max_tokens": 128, "min_tokens": 0, "ignore_eos": true, "temperature": 0.0,
     "priority": 0, "slo": {"ttft_ms": 500.0, "tbt_ms": 50.0, "jct_ms": null},        as the policies saw it
     "outcome": "finished", "finish_reason": "length", "error": null,    or failed / abandoned / refused
     "generated": 128, "ttft_ms": 41.2, "e2e_ms": 612.9,
     "deltas": [[41.2, 1], [47.9, 1], …],     ms after arrival at which each delta left, and its tokens
     "workers": ["prefill-0", "decode-0"],    who produced the tokens, in order (a migration adds more)
     "attempt": 0, "predicted_output_tokens": 117.0}

``outcome`` is ``failed`` when the stream raised before its end (``error`` names the exception; a refusal at
placement is ``Overloaded``), ``abandoned`` when the client left first, and ``refused`` when the admission gate
shed it before it started (one refused before it was tokenized has its route and arrival only). Times are the
front door's: from the gateway's receipt of the request, as its TTFT and end-to-end metrics measure them. The
prompt's tokens are not recorded (their count is), so a trace carries no user text.

A line is one ``write`` to a file opened for appending, so the front doors of one host may share a file; a
write that fails is logged once and counted (``dropped``), never the request's failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tetriserve.common.request import Request

logger = logging.getLogger(__name__)

TRACE_VERSION = 1


class RequestTrace:
    """The file the request lines go to; thread-safe (the gateways share one per process)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._lock = threading.Lock()
        self.written = 0
        self.dropped = 0

    def write(self, record: dict[str, object]) -> None:
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            try:
                os.write(self._fd, line)
            except OSError as exc:  # EBADF once closed at shutdown, ENOSPC, EIO
                self.dropped += 1
                if self.dropped == 1:
                    logger.warning("request trace %s: a line could not be written (%s); dropping lines", self.path, exc)
                return
            self.written += 1

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def arrival_of(received: float | None) -> float:
    """The wall-clock time of ``received`` (a ``time.monotonic()`` reading; None: now)."""
    now = time.time()
    return now if received is None else now - (time.monotonic() - received)


@dataclass
class TraceRecord:
    """One request's line as its stream goes: its inputs when it starts, each delta's time, then its end."""

    request: Request
    route: str
    arrival: float  # wall clock (time.time()) when the gateway received it
    deltas: list[tuple[float, int]] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)

    def saw(self, worker: str) -> None:
        """The worker of a delivered chunk (kept in order, once per run of chunks from it)."""
        if worker and (not self.workers or self.workers[-1] != worker):
            self.workers.append(worker)

    def line(
        self,
        outcome: str,
        generated: int,
        *,
        finish_reason: str | None = None,
        error: str | None = None,
        ttft_s: float | None = None,
        e2e_s: float | None = None,
        metrics: dict[str, float] | None = None,
    ) -> dict[str, object]:
        r, s = self.request, self.request.sampling
        predicted = (metrics or {}).get("predicted_output_tokens")  # a worker's estimate, on the last chunk
        return {
            "v": TRACE_VERSION,
            "id": r.request_id,
            "route": self.route,
            "arrival": round(self.arrival, 6),
            "prompt_tokens": len(r.prompt_token_ids),
            "max_tokens": s.max_tokens,
            "min_tokens": s.min_tokens,
            "ignore_eos": s.ignore_eos,
            "temperature": s.temperature,
            "priority": r.priority,
            "slo": {"ttft_ms": r.slo.ttft_ms, "tbt_ms": r.slo.tbt_ms, "jct_ms": r.slo.jct_ms},
            "outcome": outcome,
            "finish_reason": finish_reason,
            "error": error,
            "generated": generated,
            "ttft_ms": None if ttft_s is None else round(ttft_s * 1e3, 3),
            "e2e_ms": None if e2e_s is None else round(e2e_s * 1e3, 3),
            "deltas": [[round(t * 1e3, 3), n] for t, n in self.deltas],
            "workers": list(self.workers),
            "attempt": r.attempt,
            "predicted_output_tokens": predicted,
        }


def refused(route: str, arrival: float, exc: BaseException, request: Request | None = None) -> dict[str, object]:
    """The line of a request the admission gate shed: all its inputs when it was built already (``request``),
    else (refused before it was tokenized) its route and arrival only, every other input null."""
    error = f"{type(exc).__name__}: {exc}"
    if request is not None:
        return TraceRecord(request, route, arrival).line("refused", 0, error=error)
    blank = dict.fromkeys(LINE_KEYS)
    return blank | {"v": TRACE_VERSION, "route": route, "arrival": round(arrival, 6), "outcome": "refused",
                    "error": error, "generated": 0, "deltas": [], "workers": []}  # fmt: skip


LINE_KEYS = (
    "v", "id", "route", "arrival", "prompt_tokens", "max_tokens", "min_tokens", "ignore_eos", "temperature",
    "priority", "slo", "outcome", "finish_reason", "error", "generated", "ttft_ms", "e2e_ms", "deltas", "workers",
    "attempt", "predicted_output_tokens",
)  # fmt: skip
