"""What both gateways (gRPC, OpenAI HTTP) share: tokenizer, validation, detokenized streaming.

A gateway turns its wire format into plain values and calls::

    front = FrontDoor(backend)                       # loads the tokenizer from backend.model_path
    front.check_model(model)                         # UnknownModelError
    ids = front.tokenize(text) | front.chat_prompt(messages) | given ids
    request = front.build_request(request_id, ids, max_tokens=..., ...)   # InvalidRequestError(field, ...)
    async with aclosing(front.stream(request)) as deltas:
        async for delta in deltas: ...               # TextDelta: token ids + text + finish/usage/timing

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
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.errors import InvalidRequestError, UnknownModelError
from common.request import SLO, Request, SamplingSpec
from control_plane.backend import ServingBackend
from control_plane.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16
MAX_REQUEST_ID_LEN = 256


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's Hugging Face tokenizer (``AutoTokenizer``) from ``model_path``."""
    from transformers import AutoTokenizer  # heavy import, only where a tokenizer is needed

    return AutoTokenizer.from_pretrained(model_path)


@dataclass(frozen=True)
class TextDelta:
    """New tokens and their text. The last delta has ``finish_reason`` (and ``error`` if it is "error")."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    prompt_tokens: int
    completion_tokens: int  # generated so far, this delta included
    finish_reason: str | None = None
    error: str | None = None
    ttft_ms: float | None = None  # on the first delta that carries tokens
    e2e_ms: float | None = None  # on the last delta
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class FrontDoor:
    """Tokenizer + request validation + detokenized streaming over a ``ServingBackend``."""

    def __init__(self, backend: ServingBackend, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        self.backend = backend
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(backend.model_path)
        self.vocab_size = len(self.tokenizer)
        self._background: set[asyncio.Task[None]] = set()

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

    def tokenize(self, text: str, *, add_special_tokens: bool = True, field_name: str = "prompt") -> tuple[int, ...]:
        if not text:
            raise InvalidRequestError(field_name, "must not be empty")
        return tuple(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def chat_prompt(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
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
        return self.tokenize(str(text), add_special_tokens=False, field_name="messages")

    def _check_ids(self, field_name: str, ids: Sequence[int]) -> None:
        if not ids or (min(ids) >= 0 and max(ids) < self.vocab_size):
            return
        for pos, tok in enumerate(ids):
            if not 0 <= tok < self.vocab_size:
                raise InvalidRequestError(
                    field_name, f"token id {tok} at position {pos} is outside the vocabulary [0, {self.vocab_size})"
                )

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
        slo: SLO | Mapping[str, float | None] | None = None,
        priority: int = 0,
        rename: Mapping[str, str] | None = None,
    ) -> Request:
        """Validate and build the ``Request``; raises ``InvalidRequestError`` naming the field.

        ``max_tokens=None`` means ``default_max_tokens`` capped to the context left
        after the prompt (``default_max_tokens=None``: all the context left).
        """
        args = (temperature, top_p, top_k, seed, stop_token_ids, ignore_eos, slo, priority)
        try:
            return self._build(request_id, prompt_token_ids, max_tokens, default_max_tokens, *args)
        except InvalidRequestError as exc:
            if rename and exc.field in rename:
                raise InvalidRequestError(rename[exc.field], exc.message) from None
            raise

    def _build(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_tokens: int | None,
        default_max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        seed: int | None,
        stop_token_ids: Sequence[int],
        ignore_eos: bool,
        slo: SLO | Mapping[str, float | None] | None,
        priority: int,
    ) -> Request:
        if not request_id or len(request_id) > MAX_REQUEST_ID_LEN:
            raise InvalidRequestError("request_id", f"must have 1 to {MAX_REQUEST_ID_LEN} characters")
        if not prompt:
            raise InvalidRequestError("prompt", "must not be empty")
        self._check_ids("prompt", prompt)
        room = self.max_model_len - len(prompt)
        if room <= 0:
            raise InvalidRequestError(
                "prompt",
                f"has {len(prompt)} tokens, which leaves no room to generate (max_model_len is {self.max_model_len})",
            )
        if max_tokens is None:
            max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
        elif max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be >= 1, got {max_tokens}")
        elif max_tokens > room:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"({self.max_model_len}); at most {room} tokens can be generated",
            )
        temperature = 1.0 if temperature is None else temperature
        if not (math.isfinite(temperature) and 0.0 <= temperature <= 2.0):
            raise InvalidRequestError("temperature", f"must be in [0, 2], got {temperature}")
        top_p = 1.0 if top_p is None else top_p
        if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {top_p}")
        top_k = 0 if top_k is None or top_k == -1 else top_k
        if top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 1, or 0/-1 to disable, got {top_k}")
        self._check_ids("stop_token_ids", stop_token_ids)
        sampling = SamplingSpec(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos,
        )
        return Request(
            request_id=request_id,
            prompt_token_ids=tuple(prompt),
            sampling=sampling,
            slo=self._slo(slo),
            priority=priority,
        )

    @staticmethod
    def _slo(slo: SLO | Mapping[str, float | None] | None) -> SLO:
        if slo is None or isinstance(slo, SLO):
            return slo or SLO()
        for name, value in slo.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidRequestError(f"slo.{name}", f"must be a positive number of milliseconds, got {value}")
        return SLO(**slo)

    # ---- output -------------------------------------------------------------------------------

    async def stream(self, request: Request, started_at: float | None = None) -> AsyncGenerator[TextDelta, None]:
        """Run ``request`` on the backend and yield detokenized deltas; the last one is finished.

        ``started_at`` (``time.monotonic()``) is when the gateway received the
        request; TTFT and end-to-end latency are measured from it. Exceptions
        raised by the backend (e.g. ``ConnectionError``) propagate.
        """
        t0 = time.monotonic() if started_at is None else started_at
        rid = request.request_id
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids)
        source = self.backend.generate(request)
        prompt_tokens, generated, done = len(request.prompt_token_ids), 0, False
        ttft_ms: float | None = None
        try:
            async for chunk in source:
                generated += len(chunk.token_ids)
                text = detok.add(chunk.token_ids)
                first_ttft = None
                if ttft_ms is None and chunk.token_ids:
                    ttft_ms = first_ttft = (time.monotonic() - t0) * 1e3
                if not chunk.finished:
                    yield TextDelta(rid, chunk.token_ids, text, prompt_tokens, generated, ttft_ms=first_ttft)
                    continue
                done = True
                await self._drain(source, rid)
                error = (chunk.error or "unknown backend error") if chunk.finish_reason == "error" else None
                yield TextDelta(
                    rid,
                    chunk.token_ids,
                    text + detok.flush(),
                    chunk.prompt_tokens or prompt_tokens,
                    generated,
                    finish_reason=chunk.finish_reason,
                    error=error,
                    ttft_ms=first_ttft,
                    e2e_ms=(time.monotonic() - t0) * 1e3,
                    metrics=dict(chunk.metrics),
                )
                return
            done = True
            logger.error("request %s: backend stream ended without a finish reason", rid)
            yield TextDelta(
                rid,
                (),
                detok.flush(),
                prompt_tokens,
                generated,
                finish_reason="error",
                error="backend stream ended without a finish reason",
                e2e_ms=(time.monotonic() - t0) * 1e3,
            )
        finally:
            if not done:
                self._abort_in_background(source, rid)

    @staticmethod
    async def _drain(source: AsyncIterator[Any], request_id: str) -> None:
        """Let the backend generator finish normally after its last chunk."""
        extra = await anext(source, None)
        if extra is not None:
            logger.warning("request %s: backend sent a chunk after the finished one; closing it", request_id)
            await _aclose(source)

    def _abort_in_background(self, source: AsyncIterator[Any], request_id: str) -> None:
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


async def _aclose(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()
