"""One admitted OpenAI request on its way out: its ``n`` choices, merged into SSE events or one JSON body.

A request with ``n`` > 1 runs as ``n`` requests on the workers (``fan_out``):
choice ``i`` is ``{i}_{request id}`` (vLLM's child ids) with ``seed + i`` when a
seed is set, so every choice samples its own text. Their deltas are sent as
they come, one choice per chunk (``index``); usage counts the prompt once and
every choice's tokens::

    stream=true:  [chat: a role chunk per choice] chunk(index=i)... [usage chunk] data: [DONE]
    stream=false: {"choices": [choice 0, ..., choice n-1], "usage": {...}}

A choice that fails ends the whole response (the others are aborted): in-band
for a stream (its last chunk, one ``error`` event, ``[DONE]``), 500/503 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Set
from contextlib import aclosing
from dataclasses import replace

from fastapi.responses import JSONResponse

from tetriserve.common.errors import error_body
from tetriserve.common.request import Request
from tetriserve.frontdoor.admission import Overloaded
from tetriserve.frontdoor.deltas import TextDelta
from tetriserve.frontdoor.logprobs import LogprobEntry
from tetriserve.frontdoor.openai_protocol import Choice, ResponseShaper

logger = logging.getLogger(__name__)

OPEN_WINDOW_S = 0.5  # how long a response waits for its placement before it starts (headers, the role chunk)


def sse(obj: Mapping[str, object]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    type_ = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


def choice_id(index: int, request_id: str) -> str:
    """The worker request id of choice ``index`` of a request with ``n`` > 1 choices (vLLM's child ids)."""
    return f"{index}_{request_id}"


def request_id_for(asked: str | None, live: Set[str]) -> str:
    """A new request's id: the one its client asked for (``x-request-id``), unless a request of that id, or the
    first choice of one, is in flight (``live``): then that id with a suffix that makes it unique. A fresh one
    when none was asked for."""
    if not asked:
        return uuid.uuid4().hex
    if asked in live or choice_id(0, asked) in live:
        return f"{asked}-{uuid.uuid4().hex[:8]}"
    return asked


def fan_out(request: Request, n: int) -> list[Request]:
    """The ``n`` worker requests of one request with ``n`` choices (itself when ``n`` is 1)."""
    if n == 1:
        return [request]
    seed = request.sampling.seed
    return [
        replace(
            request,
            request_id=choice_id(i, request.request_id),
            sampling=replace(request.sampling, seed=None if seed is None else seed + i),
            events=[],
        )
        for i in range(n)
    ]


class Generation:
    """The deltas of a request's choices (``streams[i]`` is choice ``i``), shaped by ``shaper``.

    ``open`` waits a moment for the first delta before the response starts, so a refusal that comes with the
    placement (every prefill worker full: ``Overloaded``) is answered 429, not inside a started stream.
    """

    def __init__(self, streams: list[AsyncGenerator[TextDelta, None]], request_id: str, shaper: ResponseShaper) -> None:
        self.streams, self.request_id, self.shaper = streams, request_id, shaper
        self._deltas = self._merged()
        self._first: asyncio.Future[tuple[int, TextDelta]] | None = None

    async def open(self, window_s: float = OPEN_WINDOW_S) -> None:
        """Start the request; raise what ends it before its first delta within ``window_s`` (``Overloaded``)."""
        self._first = asyncio.ensure_future(anext(self._deltas))
        await asyncio.wait({self._first}, timeout=window_s)
        if self._first.done() and not isinstance(self._first.exception(), (StopAsyncIteration, type(None))):
            await self._deltas.aclose()
            self._first.result()  # raises it

    async def _items(self) -> AsyncGenerator[tuple[int, TextDelta], None]:
        async with aclosing(self._deltas) as deltas:
            if self._first is not None:
                try:
                    yield await self._first
                except StopAsyncIteration:
                    return
            async for item in deltas:
                yield item

    async def _merged(self) -> AsyncGenerator[tuple[int, TextDelta], None]:
        """(choice, delta) in arrival order; leaving early closes every choice's stream (which aborts it)."""
        if len(self.streams) == 1:
            async with aclosing(self.streams[0]) as deltas:
                async for delta in deltas:
                    yield 0, delta
            return
        queue: asyncio.Queue[tuple[int, TextDelta | Exception | None]] = asyncio.Queue()

        async def pump(index: int, stream: AsyncGenerator[TextDelta, None]) -> None:
            try:
                async with aclosing(stream) as deltas:
                    async for delta in deltas:
                        queue.put_nowait((index, delta))
            except Exception as exc:
                queue.put_nowait((index, exc))
                return
            queue.put_nowait((index, None))

        tasks = [asyncio.create_task(pump(i, s), name=f"choice-{i}") for i, s in enumerate(self.streams)]
        try:
            running = len(tasks)
            while running:
                index, item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        if self.shaper.chat:
            for index in range(len(self.streams)):
                yield sse(self.shaper.role_chunk(index))
        prompt_tokens, completion = 0, [0] * len(self.streams)
        failed = False
        try:
            async with aclosing(self._items()) as items:
                async for index, delta in items:
                    prompt_tokens, completion[index] = delta.prompt_tokens, delta.completion_tokens
                    yield sse(self.shaper.chunk(delta, index))
                    if delta.error is not None:
                        logger.warning("request %s failed in the backend: %s", self.request_id, delta.error)
                        code = "service_unavailable" if delta.unavailable else "backend_error"
                        yield sse(error_body(f"request failed: {delta.error}", "server_error", None, code))
                        failed = True
                        break
            if include_usage and not failed:
                yield sse(self.shaper.usage_chunk(prompt_tokens, sum(completion)))
        except Overloaded as exc:  # refused after the response started (the placement came late)
            yield sse(error_body(exc.message, "rate_limit_error", None, "overloaded"))
        except Exception as exc:  # the response has started: report in-band
            logger.exception("request %s: stream failed", self.request_id)
            code = "backend_unavailable" if isinstance(exc, ConnectionError) else "internal_error"
            yield sse(error_body(f"{type(exc).__name__}: {exc}", "server_error", None, code))
        yield "data: [DONE]\n\n"

    async def whole(self) -> JSONResponse:
        n = len(self.streams)
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list[LogprobEntry]] = [[] for _ in range(n)]
        last: list[TextDelta | None] = [None] * n
        async with aclosing(self._items()) as items:
            async for index, delta in items:
                texts[index].append(delta.text)
                logprobs[index].extend(delta.logprobs or ())
                last[index] = delta
                if delta.error is not None:
                    break
        choices = []
        for index, end in enumerate(last):
            if end is None or end.error is not None:
                reason = end.error if end is not None else "no output"
                message = f"request {self.request_id} failed: {reason}"
                if end is not None and end.unavailable:
                    return error_response(503, message, None, "service_unavailable")
                return error_response(500, message, None, "backend_error")
            entries = tuple(logprobs[index]) if self.shaper.top_logprobs is not None else None
            choices.append(Choice("".join(texts[index]), end, entries))
        return JSONResponse(self.shaper.whole(choices))
