"""OpenAI-compatible HTTP front door (FastAPI), for OpenAI clients and ``vllm bench serve``.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /health`` (liveness), ``GET /ready`` (readiness: 503 once draining), ``GET /metrics``
(Prometheus text, ``observability/metrics.py``), and
vLLM's ``POST /tokenize`` / ``POST /detokenize`` (the front door's tokenizer). A body
over ``max_body_bytes`` is refused with 413 before it is parsed (``http_limits``); with API keys configured,
every route but /health, /ready (and /metrics, by setting) needs ``Authorization: Bearer <key>``: 401 / 429
(``http_auth``). TLS from ``security.tls``. A request's life::

    JSON body ─▶ pydantic model ─▶ unsupported options? ─▶ FrontDoor: model, tokens, validation
        │ any failure ─▶ 4xx OpenAI error body {"error": {message, type, param, code}}
        ▼
    stream=false: collect deltas ─▶ one JSON body with usage (client disconnect cancels + aborts)
    stream=true:  SSE "data: {chunk}\\n\\n" per delta ... [usage chunk] ... "data: [DONE]\\n\\n"
                  client disconnect ─▶ generator cancelled ─▶ backend stream closed + backend.abort

Status codes follow vLLM: 400 for invalid input (malformed JSON and pydantic
errors included, not FastAPI's 422), 404 ``model_not_found`` for an unknown
model, 413 for a body over the limit, 429 with ``Retry-After`` when the
admission gate refuses the request (``admission.py``: it would wait past
``admission.max_wait_s``), 503 when the backend is unreachable or no worker could take the request
(``service_unavailable``: re-placement and migration gave up), 500 when the
request fails inside the cluster. Once a stream has started, a failure is sent
as a last chunk with ``finish_reason: "error"`` (the text so far), one SSE
event ``data: {"error": {...}}`` and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tetriserve.common.errors import InvalidRequestError, UnknownModelError, error_body
from tetriserve.common.request import Request as ServingRequest
from tetriserve.frontdoor.admission import Draining, Overloaded
from tetriserve.frontdoor.backend import AdminClient, RequestRouter
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.frontdoor.field_checks import check_ids, unicode_text
from tetriserve.frontdoor.http_auth import ApiKeyGuard
from tetriserve.frontdoor.http_limits import DEFAULT_MAX_BODY_BYTES, BodyLimit
from tetriserve.frontdoor.openai_generation import Generation, error_response, fan_out, request_id_for
from tetriserve.frontdoor.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponseShaper,
    TokenizeRequest,
)
from tetriserve.frontdoor.security import FrontDoorSecurity
from tetriserve.observability.metrics import CONTENT_TYPE, MetricsExporter

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
DEFAULT_COMPLETION_TOKENS = 16


_PYDANTIC_MARKERS = frozenset({"body", "str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: Sequence[object]) -> str:
    """The dotted field path of a pydantic error location, without pydantic's union/type markers."""
    parts = [str(p) for p in loc if not (str(p) in _PYDANTIC_MARKERS or "[" in str(p) or "-" in str(p))]
    return ".".join(parts)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(UnknownModelError)
    async def unknown_model(_: Request, exc: UnknownModelError) -> JSONResponse:
        return error_response(404, exc.message, exc.field, "model_not_found")

    @app.exception_handler(InvalidRequestError)
    async def invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(400, str(exc), exc.field)

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(str(e.get("ctx", {}).get("error", "")) for e in errors if e.get("type") == "json_invalid")
            return error_response(400, f"malformed JSON body: {detail}".rstrip(": "), None, "invalid_json")
        messages: dict[str, str] = {}  # first message per field (a union field fails once per member)
        for e in errors:
            messages.setdefault(_param(e.get("loc", ())), str(e.get("msg", "invalid")))
        lines = [f"{name or 'body'}: {msg}" for name, msg in list(messages.items())[:10]]
        return error_response(400, "; ".join(lines) or "invalid request body", next(iter(messages), None) or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        body = error_body(exc.message, "rate_limit_error", None, "overloaded")
        return JSONResponse(body, status_code=429, headers={"retry-after": str(exc.retry_after_s)})

    @app.exception_handler(Draining)
    async def draining(_: Request, exc: Draining) -> JSONResponse:
        return error_response(503, str(exc), None, "draining")

    @app.exception_handler(ConnectionError)
    async def unavailable(_: Request, exc: ConnectionError) -> JSONResponse:
        logger.warning("backend unavailable: %s", exc)
        return error_response(503, f"backend unavailable: {exc}", None, "backend_unavailable")

    @app.exception_handler(Exception)
    async def internal(raw: Request, exc: Exception) -> JSONResponse:
        """A bug, answered in OpenAI's error shape rather than as plain text (the traceback goes to the log)."""
        logger.error("%s %s failed", raw.method, raw.url.path, exc_info=exc)
        return error_response(500, "internal server error (the server's log has the details)", None, "internal_error")


async def _cancel_on_disconnect(raw: Request, work: Awaitable[_T]) -> _T | None:
    """Await ``work``; if the client disconnects first, cancel it and return ``None``."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def build_app(
    backend: RequestRouter,
    *,
    admin: AdminClient | None = None,
    front: FrontDoor | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    security: FrontDoorSecurity | None = None,
    metrics: MetricsExporter | None = None,
) -> FastAPI:
    """The OpenAI-compatible app over ``backend`` and ``admin`` (``front`` shares a tokenizer with the gRPC
    gateway, and its admin client)."""
    front = front if front is not None else FrontDoor(backend, admin=admin)
    exporter = metrics if metrics is not None else MetricsExporter(front, front.admin)
    app = FastAPI(title="tetriserve", summary="OpenAI-compatible front door of tetriserve")
    app.state.security = security or FrontDoorSecurity()  # its keys.stats(): requests judged, by outcome
    app.add_middleware(ApiKeyGuard, security=app.state.security)  # inside the body limit
    app.add_middleware(BodyLimit, limit_bytes=max_body_bytes)
    app.state.front = front
    _install_error_handlers(app)
    started_at = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        """Liveness: the front door answers and its backend serves (a drain does not fail it)."""
        if await front.admin.healthy():
            return Response(status_code=200)
        return error_response(503, "backend is not serving", None, "unhealthy")

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: live and admitting; unready from the start of a drain (SIGTERM) on."""
        if front.gate.closed:
            return error_response(503, "draining: admits no new requests", None, "draining")
        return await health()

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition: this front door's requests and its cluster's workers
        (``observability/metrics.py``)."""
        return Response(await exporter.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        card = {
            "id": front.model_name,
            "object": "model",
            "created": started_at,
            "owned_by": "tetriserve",
            "root": backend.model_path,
            "parent": None,
            "max_model_len": front.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, object]:
        front.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("prompt", "send either prompt or messages")
        if body.messages is not None:
            messages = [m.as_template_input(i) for i, m in enumerate(body.messages)]
            special = bool(body.add_special_tokens)
            ids = await front.encode_chat(messages, add_generation_prompt=body.add_generation_prompt, special=special)
        else:
            assert body.prompt is not None  # one of the two: checked above
            special = body.add_special_tokens is not False
            text = unicode_text("prompt", body.prompt)
            ids = tuple(await asyncio.to_thread(front.tokenizer.encode, text, add_special_tokens=special))
        strs = front.tokenizer.convert_ids_to_tokens(list(ids)) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": front.max_model_len, "tokens": list(ids), "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, object]:
        front.check_model(body.model)
        check_ids("tokens", body.tokens, front.vocab_size)
        return {"prompt": await asyncio.to_thread(front.tokenizer.decode, body.tokens)}

    async def run(raw: Request, body: CompletionRequest | ChatCompletionRequest, req: ServingRequest) -> Response:
        chat = isinstance(body, ChatCompletionRequest)
        shaper = ResponseShaper(chat, req.request_id, front.model_name, req.sampling.logprobs, body.continuous_usage)
        # the client's trace, if it sent one (``observability/request_span.py``)
        req.trace = raw.headers.get("traceparent")
        route = f"{raw.method} {raw.url.path}"
        streams = [front.admitted_stream(r, raw.state.started, route) for r in fan_out(req, body.n)]
        gen = Generation(streams, req.request_id, shaper)
        await gen.open()  # a refusal at placement (every prefill worker full) is a 429 here
        headers = {"x-request-id": req.request_id}
        if body.stream:
            return StreamingResponse(gen.events(body.include_usage), media_type="text/event-stream", headers=headers)
        response = await _cancel_on_disconnect(raw, gen.whole())
        if response is None:
            logger.info("request %s: client disconnected", req.request_id)
            return Response(status_code=499)
        response.headers.update(headers)
        return response

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        raw.state.started = time.monotonic()
        front.check_admission(raw.state.started, "POST /v1/completions")  # before it costs a tokenization
        body.check_supported()
        front.check_model(body.model)
        prompt = body.single_prompt()
        ids = await front.encode(prompt) if isinstance(prompt, str) else tuple(prompt)
        if "max_tokens" in body.model_fields_set:  # explicit null means "all the context left"
            req = _build(front, raw, body, ids, body.max_tokens, default_max_tokens=None)
        else:  # OpenAI's default of 16, capped to the context left
            req = _build(front, raw, body, ids, None, default_max_tokens=DEFAULT_COMPLETION_TOKENS)
        return await run(raw, body, req)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        raw.state.started = time.monotonic()
        front.check_admission(raw.state.started, "POST /v1/chat/completions")
        body.check_supported()
        front.check_model(body.model)
        messages = [m.as_template_input(i) for i, m in enumerate(body.messages)]
        ids = await front.encode_chat(messages, add_generation_prompt=body.add_generation_prompt)
        name, limit = body.token_limit
        rename = {"max_tokens": name, "logprobs": "top_logprobs"}
        req = _build(front, raw, body, ids, limit, default_max_tokens=None, rename=rename)
        return await run(raw, body, req)

    return app


def _build(
    front: FrontDoor,
    raw: Request,
    body: CompletionRequest | ChatCompletionRequest,
    ids: tuple[int, ...] | list[int],
    max_tokens: int | None,
    *,
    default_max_tokens: int | None,
    rename: dict[str, str] | None = None,
) -> ServingRequest:
    return front.build_request(
        request_id_for(raw.headers.get("x-request-id"), front.live_ids),
        ids,
        max_tokens=max_tokens,
        default_max_tokens=default_max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop_token_ids=body.stop_token_ids or (),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        stop=body.stop,
        logprobs=body.logprobs_asked,
        min_p=body.min_p,
        logit_bias=body.logit_bias,
        allowed_token_ids=body.allowed_token_ids,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        slo=body.slo.model_dump() if body.slo else None,
        priority=body.priority,
        rename=rename,
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the process embedding the gateway owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class HttpServerHandle:
    """A running HTTP gateway: where it listens and how to stop it."""

    host: str
    port: int
    server: uvicorn.Server
    task: asyncio.Task[None]
    scheme: str = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, let open requests finish (up to the graceful timeout), then return."""
        self.server.should_exit = True
        await self.task


async def start_http_server(
    backend: RequestRouter,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    admin: AdminClient | None = None,
    front: FrontDoor | None = None,
    graceful_shutdown_s: float = 5.0,
    keepalive_s: float = 75.0,
    access_log: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    security: FrontDoorSecurity | None = None,
    metrics: MetricsExporter | None = None,
) -> HttpServerHandle:
    """Serve ``build_app(backend)`` with uvicorn in the running event loop; ``port=0`` picks a free port."""
    if front is None:
        front = await asyncio.to_thread(FrontDoor, backend, None, None, admin)
    security = security or FrontDoorSecurity()
    app = build_app(backend, front=front, max_body_bytes=max_body_bytes, security=security, metrics=metrics)
    tls = security.tls
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = _listen(host, port, family)  # bound and listening: the port is known now
    config = uvicorn.Config(
        app,
        log_config=None,  # keep the embedding process's logging configuration
        access_log=access_log,
        lifespan="off",
        timeout_graceful_shutdown=math.ceil(graceful_shutdown_s),
        timeout_keep_alive=math.ceil(keepalive_s),
        ssl_certfile=None if tls is None else str(tls.cert),
        ssl_keyfile=None if tls is None else str(tls.key),
    )
    server = _EmbeddedServer(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="http-gateway")
    deadline = time.monotonic() + 30.0
    while not server.started:
        if task.done():
            task.result()  # raises the startup error
            raise RuntimeError("HTTP gateway exited during startup")
        if time.monotonic() > deadline:
            raise TimeoutError(f"HTTP gateway did not start on {host}:{port} within 30 s")
        await asyncio.sleep(0.01)
    bound = sock.getsockname()[1]
    logger.info("HTTP gateway serving %s on %s://%s:%s", front.model_name, security.scheme, host, bound)
    return HttpServerHandle(host=host, port=bound, server=server, task=task, scheme=security.scheme)


def _listen(host: str, port: int, family: socket.AddressFamily) -> socket.socket:
    """A listening TCP socket whose connections get TCP_NODELAY from asyncio. asyncio sets it only on sockets
    whose ``proto`` is IPPROTO_TCP, and ``socket.create_server`` makes them with proto 0: on a kept-alive
    connection Nagle would then hold each small write (a response's first chunk after its headers) until the
    client's delayed ACK, 40 ms."""
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as socket.create_server does
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock
