"""What both gateways (gRPC, OpenAI HTTP) share: tokenizer, validation, detokenized streaming.

A gateway turns its wire format into plain values and calls::

    front = FrontDoor(backend)                       # loads the tokenizer from backend.model_path
    front.check_model(model)                         # UnknownModelError
    ids = await front.encode(text) | await front.encode_chat(messages) | given ids   # in a thread
    request = front.build_request(request_id, ids, max_tokens=..., ...)   # InvalidRequestError(field, ...)
    async with aclosing(front.stream(request)) as deltas:
        async for delta in deltas: ...               # TextDelta: token ids + text + finish/usage/timing
    front.admitted_stream(request)                   # the same stream, or Overloaded (admission.py) at once

The front door owns the request's text: prompts are tokenized once, off the
event loop; engines never detokenize, and ``stream`` turns the ordered tokens
into text once, incrementally, and matches stop strings over the whole text
(one may span the prefill→decode handoff, which no engine sees whole). A stop
string ends the stream at its first character and aborts the request on the
workers, with ``stop`` as the outcome. vLLM's rules hold: the token that
stopped the engine (EOS, a stop token id) has no text, a character cut off at
the end is dropped, and the logprobs a request asked for are named here
(``logprobs.py``) with the whole output as context.

``stream`` guarantees cleanup: if the consumer stops early (client gone,
deadline, cancellation) the backend's generator is closed and
``backend.abort(request_id)`` is called from a background task, so it runs
even while the gateway's own task is being cancelled.

Field names in errors are the OpenAI ones (``max_tokens``, ``top_p``, ...);
``rename`` maps them to a gateway's own (``sampling.max_tokens`` for gRPC).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tetriserve.common import log_context
from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.common.errors import InvalidRequestError, UnknownModelError
from tetriserve.common.request import SLO, Request, SamplingSpec
from tetriserve.common.slo_config import SloConfig
from tetriserve.common.stream import FinishReason, StreamChunk
from tetriserve.frontdoor.admission import AdmissionGate, Overloaded, Ticket
from tetriserve.frontdoor.backend import AdminClient, RequestRouter
from tetriserve.frontdoor.deltas import TextDelta, stop_token, take_output
from tetriserve.frontdoor.detokenizer import IncrementalDetokenizer
from tetriserve.frontdoor.field_checks import (
    PRIORITY_RANGE,
    SEED_RANGE,
    allowed_ids_value,
    check_head,
    check_ids,
    in_range,
    int_value,
    logit_bias_value,
    logprobs_value,
    max_tokens_value,
    min_tokens_value,
    slo_value,
    top_k_value,
    unicode_text,
)
from tetriserve.frontdoor.logprobs import LogprobNamer, TokenStrings
from tetriserve.frontdoor.stop_strings import StopMatcher, stop_strings
from tetriserve.frontdoor.stream_observers import (
    EndKind,
    MetricsObserver,
    SpanObserver,
    StreamEnd,
    StreamObserver,
    TraceObserver,
)
from tetriserve.observability.request_metrics import RequestMetrics
from tetriserve.observability.request_span import RequestSpan
from tetriserve.observability.request_trace import RequestTrace, TraceRecord, arrival_of, refused

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16
MAX_REQUEST_ID_LEN = 256


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's Hugging Face tokenizer (``AutoTokenizer``) from ``model_path``."""
    from transformers import AutoTokenizer  # heavy import, only where a tokenizer is needed

    return AutoTokenizer.from_pretrained(model_path)


class FrontDoor:
    """Tokenizer + request validation + detokenized streaming over a ``RequestRouter``; the gateways'
    administration goes to ``admin`` (the backend itself when it is an ``AdminClient`` too: the tests' fakes)."""

    def __init__(
        self,
        backend: RequestRouter,
        tokenizer: PreTrainedTokenizerBase | None = None,
        limits: AdmissionConfig | None = None,
        admin: AdminClient | None = None,
        slo: SloConfig | None = None,
        trace: RequestTrace | None = None,
    ) -> None:
        """``slo``: the service's objectives for requests that name none (``common/slo_config.py``); ``trace``:
        where each request's line goes when its stream closes (``observability/request_trace.py``)."""
        if admin is None:
            if not isinstance(backend, AdminClient):
                raise TypeError(f"FrontDoor: {type(backend).__name__} is no admin client; pass admin=")
            admin = backend
        self.backend, self.admin = backend, admin
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(backend.model_path)
        self.vocab_size = len(self.tokenizer)
        self.max_token_chars = max(1, max(map(len, self.tokenizer.get_vocab()), default=1))  # for ``check_head``
        self.token_strings = TokenStrings(self.tokenizer)
        self.gate = AdmissionGate(limits or AdmissionConfig())
        self.slo_defaults = slo or SloConfig()
        self.metrics = RequestMetrics()  # what /metrics and `tetriserve top` show of this front door's requests
        self.trace = trace
        self._background: set[asyncio.Task[None]] = set()
        self.live_ids: set[str] = set()  # ids of the requests streaming from here (``stream``)

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    @property
    def max_model_len(self) -> int:
        return self.backend.max_model_len

    # ---- inputs -------------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        """Accept an empty/absent model or the served one; raise ``UnknownModelError`` otherwise."""
        if model and model != self.model_name:
            raise UnknownModelError(model, self.model_name)

    async def encode(self, text: str, *, field_name: str = "prompt") -> tuple[int, ...]:
        """``tokenize`` in a worker thread, so a long prompt does not hold up the event loop's other streams."""
        return await asyncio.to_thread(self.tokenize, text, field_name=field_name)

    async def encode_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True, special: bool = False
    ) -> tuple[int, ...]:
        """``chat_prompt`` in a worker thread (``special``: add special tokens on top of the template's)."""
        return await asyncio.to_thread(
            self.chat_prompt, messages, add_generation_prompt=add_generation_prompt, special=special
        )

    def tokenize(self, text: str, *, add_special_tokens: bool = True, field_name: str = "prompt") -> tuple[int, ...]:
        """``text``'s token ids; a text far longer than the context is refused from its head (``check_head``)."""
        if not text:
            raise InvalidRequestError(field_name, "must not be empty")
        unicode_text(field_name, text)
        check_head(field_name, text, self.tokenizer.encode, self.max_model_len, self.max_token_chars)
        return tuple(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def chat_prompt(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True, special: bool = False
    ) -> tuple[int, ...]:
        """Token ids of ``messages`` rendered with the model's chat template."""
        if not messages:
            raise InvalidRequestError("messages", "must contain at least one message")
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError("messages", f"model '{self.model_name}' has no chat template")
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as exc:  # jinja2 errors raised by the template itself (e.g. role order)
            raise InvalidRequestError("messages", f"chat template failed: {exc}") from exc
        return self.tokenize(str(text), add_special_tokens=special, field_name="messages")

    def build_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int | None = None,
        default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        min_tokens: int | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = None,
        logprobs: int | None = None,
        min_p: float | None = None,
        logit_bias: Mapping[str, float] | Mapping[int, float] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        slo: SLO | Mapping[str, float | None] | None = None,
        priority: int = 0,
        rename: Mapping[str, str] | None = None,
    ) -> Request:
        """Validate and build the ``Request``; raises ``InvalidRequestError`` naming the field.

        ``max_tokens=None`` means ``default_max_tokens`` capped to the context left
        after the prompt (``default_max_tokens=None``: all the context left).
        Ranges are vLLM's: penalties in [-2, 2], repetition penalty > 0, ``logprobs``
        (the alternatives per position, None for no logprobs) in [0, 20],
        ``min_p`` in [0, 1], ``logit_bias`` token ids in the vocabulary (biases clamped to [-100, 100]).
        """
        try:
            if not request_id or len(request_id) > MAX_REQUEST_ID_LEN:
                raise InvalidRequestError("request_id", f"must have 1 to {MAX_REQUEST_ID_LEN} characters")
            prompt = tuple(prompt_token_ids)
            max_tokens = max_tokens_value(prompt, max_tokens, default_max_tokens, self.max_model_len, self.vocab_size)
            check_ids("stop_token_ids", stop_token_ids, self.vocab_size)
            sampling = SamplingSpec(
                max_tokens=max_tokens,
                temperature=in_range("temperature", temperature, 1.0, 0.0, 2.0),
                top_p=in_range("top_p", top_p, 1.0, 0.0, 1.0, low_open=True),
                top_k=top_k_value(top_k, self.vocab_size),
                seed=int_value("seed", seed, *SEED_RANGE),
                stop_token_ids=tuple(stop_token_ids),
                ignore_eos=ignore_eos,
                min_tokens=min_tokens_value(min_tokens, max_tokens),
                presence_penalty=in_range("presence_penalty", presence_penalty, 0.0, -2.0, 2.0),
                frequency_penalty=in_range("frequency_penalty", frequency_penalty, 0.0, -2.0, 2.0),
                repetition_penalty=in_range(
                    "repetition_penalty", repetition_penalty, 1.0, 0.0, math.inf, low_open=True
                ),
                stop=stop_strings(stop),
                logprobs=logprobs_value(logprobs),
                min_p=in_range("min_p", min_p, 0.0, 0.0, 1.0),
                logit_bias=logit_bias_value(logit_bias, self.vocab_size),
                allowed_token_ids=allowed_ids_value(allowed_token_ids, self.vocab_size),
                include_stop_str_in_output=include_stop_str_in_output,
                skip_special_tokens=skip_special_tokens,
            )
            int_value("priority", priority, *PRIORITY_RANGE)
            asked = slo_value(slo)
            return Request(
                request_id, prompt, sampling, slo=self.slo_defaults.for_request(len(prompt), asked), priority=priority
            )
        except InvalidRequestError as exc:
            if rename and exc.field in rename:
                raise InvalidRequestError(rename[exc.field], exc.message) from None
            raise

    def check_admission(self, started: float, route: str) -> None:
        """``gate.check`` before the request is even tokenized (a flood is refused before it costs that); a
        refusal has its line in the request trace, with the route and arrival only."""
        try:
            self.gate.check(started)
        except Overloaded as exc:
            if self.trace is not None:
                self.trace.write(refused(route, arrival_of(started), exc))
            raise

    # ---- output -------------------------------------------------------------------------------

    def admitted_stream(
        self, request: Request, started_at: float | None = None, route: str = ""
    ) -> AsyncGenerator[TextDelta, None]:
        """``stream(request)`` under the admission gate: raises ``Overloaded`` now if the request would wait
        past the bound. The ticket is released when the stream ends, or when it is dropped unstarted."""
        log_context.bind(request.request_id, request.trace)  # the gateway's own log lines of it
        try:
            ticket = self.gate.admit(time.monotonic())
        except Overloaded as exc:
            if self.trace is not None:  # a refused arrival is part of the workload too
                self.trace.write(refused(route, arrival_of(started_at), exc, request))
            raise
        deltas = self.stream(request, started_at, ticket, route)
        weakref.finalize(deltas, lambda: ticket.release(time.monotonic()))
        return deltas

    async def stream(
        self, request: Request, started_at: float | None = None, ticket: Ticket | None = None, route: str = ""
    ) -> AsyncGenerator[TextDelta, None]:
        """Run ``request`` on the backend and yield detokenized deltas; the last one is finished.

        ``started_at`` (``time.monotonic()``) is when the gateway received the
        request; TTFT and end-to-end latency are measured from it. Exceptions
        raised by the backend (e.g. ``ConnectionError``) propagate. ``ticket``
        (``admitted_stream``) starts at the second token and is released at the end. ``route`` names the
        gateway's route on the request's root span (``observability/request_span.py``). The request's metrics
        and span watch the stream as observers (``frontdoor/stream_observers.py``).
        """
        rid = request.request_id
        if rid in self.live_ids:  # refused before it touches anything of the one in flight
            raise InvalidRequestError("request_id", f"request id {rid!r} is already in flight; each needs its own")
        self.live_ids.add(rid)
        t0 = time.monotonic() if started_at is None else started_at
        span = RequestSpan(request, self.model_name, route, t0)  # sets request.trace: the workers continue it
        observers: tuple[StreamObserver, ...] = (MetricsObserver(self.metrics), SpanObserver(span))
        if self.trace is not None:
            observers += (TraceObserver(self.trace, TraceRecord(request, route, arrival_of(t0))),)
        out = _Output(self, request, t0, observers)
        source = self.backend.generate(request)
        failure: BaseException | None = None
        try:
            async for chunk in source:
                tokens, text = take_output(chunk, out.detok, out.stops)
                out.generated += len(tokens)
                if ticket is not None and (out.generated >= 2 or chunk.finished):
                    ticket.start(time.monotonic())
                if not chunk.finished and out.stops.stopped is None:
                    yield out.delta(chunk, tokens, text)
                    continue
                out.done = True
                if out.stops.stopped is not None and not chunk.finished:  # ours: the workers are still generating
                    await self.backend.abort(rid, FinishReason.STOP)
                    await self._drain(source, rid, until_finished=True)
                    yield out.last(chunk, tokens, text, "stop", None, stop_reason=out.stops.stopped)
                    return
                await self._drain(source, rid)
                if out.stops.stopped is None:
                    text += out.stops.flush()
                reason = "stop" if out.stops.stopped is not None else (chunk.finish_reason or "error")
                error = (chunk.error or "unknown backend error") if reason == "error" else None
                yield out.last(
                    chunk,
                    tokens,
                    text,
                    reason,
                    error,
                    "unavailable" if error is not None and chunk.retry else "backend",
                    metrics=dict(chunk.metrics or {}),
                    stop_reason=out.stops.stopped or stop_token(request, tokens, reason),
                )
                return
            out.done = True
            logger.error("request %s: backend stream ended without a finish reason", rid)
            yield out.last(None, (), out.stops.flush(), "error", "backend stream ended without a finish reason",
                           "no_finish")  # fmt: skip
        except Exception as exc:
            failure = exc
            if not out.ended:  # before its end was told (an abort or a drain after the last chunk may fail too)
                for observer in out.observers:
                    observer.failed(exc)
            raise
        finally:
            self.live_ids.discard(rid)
            if ticket is not None:
                ticket.release(time.monotonic())
            if not out.ended and failure is None:  # the consumer left before the end: the client is gone
                out.notify(lambda o: o.abandoned(out.prompt_tokens, out.generated))
            if not out.done:
                self._abort_in_background(source, rid)
            out.notify(lambda o: o.closed(out.generated, failure))

    @staticmethod
    async def _drain(source: AsyncIterator[StreamChunk], request_id: str, *, until_finished: bool = False) -> None:
        """Let the backend generator finish normally after its last chunk (``until_finished``: skip what comes
        before the finish of a request we aborted)."""
        while (extra := await anext(source, None)) is not None:
            if until_finished:
                until_finished = not extra.finished
                continue
            logger.warning("request %s: backend sent a chunk after the finished one; closing it", request_id)
            await _aclose(source)
            return

    def _abort_in_background(self, source: AsyncIterator[StreamChunk], request_id: str) -> None:
        async def cleanup() -> None:
            try:
                await _aclose(source)
            except Exception:
                logger.exception("request %s: closing the backend stream failed", request_id)
            try:
                aborted = await self.backend.abort(request_id)
                logger.info("request %s: client gone, aborted=%s", request_id, aborted)
            except Exception:
                logger.exception("request %s: backend abort failed", request_id)

        try:
            task = asyncio.get_running_loop().create_task(cleanup(), name=f"abort-{request_id}")
        except RuntimeError:  # no running loop: the stream was garbage-collected at shutdown
            logger.warning("request %s: cannot abort, no running event loop", request_id)
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class _Output:
    """One request's output as ``FrontDoor.stream`` makes it: its text state (detokenizer, stop strings,
    logprob names), its counts and times, and the observers it tells."""

    def __init__(self, front: FrontDoor, request: Request, t0: float, observers: tuple[StreamObserver, ...]) -> None:
        sampling = request.sampling
        self.request_id, self.t0, self.observers = request.request_id, t0, observers
        self.detok = IncrementalDetokenizer(
            front.tokenizer, request.prompt_token_ids, skip_special_tokens=sampling.skip_special_tokens
        )
        self.stops = StopMatcher(sampling.stop, include=sampling.include_stop_str_in_output)
        self.namer = LogprobNamer(front.token_strings) if sampling.logprobs is not None else None
        self.prompt_tokens, self.generated, self.done = len(request.prompt_token_ids), 0, False
        self.ended = False  # the observers have heard how it ended
        self.ttft_ms: float | None = None
        self.last_at = t0  # when the latest tokens went out

    def notify(self, event: Callable[[StreamObserver], None]) -> None:
        for observer in self.observers:
            event(observer)

    def delta(self, chunk: StreamChunk | None, tokens: tuple[int, ...], text: str) -> TextDelta:
        """The delta of ``tokens`` and ``text``; the observers hear of the tokens."""
        first = None
        if tokens:
            now, n, worker = time.monotonic(), len(tokens), "" if chunk is None else chunk.worker
            if self.ttft_ms is None:
                self.ttft_ms = first = (now - self.t0) * 1e3
                ttft_s = now - self.t0
                self.notify(lambda o: o.first_token(ttft_s, n, worker))
            else:
                gap_s = now - self.last_at
                self.notify(lambda o: o.tokens(gap_s, n, worker))
            self.last_at = now
        lps = self.namer.name(tokens, chunk.logprobs) if self.namer is not None and chunk is not None else None
        return TextDelta(self.request_id, tokens, text, self.prompt_tokens, self.generated, ttft_ms=first, logprobs=lps)

    def last(
        self,
        chunk: StreamChunk | None,
        tokens: tuple[int, ...],
        text: str,
        reason: str,
        error: str | None,
        kind: EndKind = "backend",
        metrics: Mapping[str, float] | None = None,
        stop_reason: str | int | None = None,
    ) -> TextDelta:
        """The finished delta; the observers hear how the stream ended."""
        delta = self.delta(chunk, tokens, text)
        e2e_s = time.monotonic() - self.t0  # after the last tokens left
        out = replace(
            delta,
            finish_reason=reason,
            error=error,
            unavailable=kind == "unavailable",
            e2e_ms=e2e_s * 1e3,
            metrics=dict(metrics or {}),
            stop_reason=stop_reason,
        )
        ttft_s = None if self.ttft_ms is None else self.ttft_ms / 1e3
        end = StreamEnd(reason, error, self.prompt_tokens, self.generated, e2e_s, ttft_s, kind, dict(metrics or {}))
        self.ended = True
        self.notify(lambda o: o.finished(end))
        return out


async def _aclose(source: AsyncIterator[StreamChunk]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()
