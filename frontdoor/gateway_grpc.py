"""gRPC front door: the ``tetriserve.v1.TetriServe`` service over a ``RequestRouter`` and an ``AdminClient``.

Generate's life::

    GenerateRequest ─▶ check model, tokenize text, validate ─▶ common.request.Request
        │  invalid ─▶ INVALID_ARGUMENT "field: message" (+ trailing metadata tetriserve-field=field)
        ▼
    FrontDoor.stream ─▶ backend.generate ─▶ GenerateResponse per chunk (ids + text delta)
        │  first tokens carry ttft_ms; the last message carries finish_reason, usage, e2e_ms
        │  backend chunk finish_reason "error" ─▶ tokens so far, then INTERNAL "request <id> failed: <reason>"
        │      (UNAVAILABLE when no worker could take it, after re-placement and migration gave up)
        │  backend raises ConnectionError ─▶ UNAVAILABLE (clients retry it before the first token)
        ▼
    client cancels / deadline passes ─▶ handler cancelled ─▶ backend stream closed + backend.abort(id)

Why INTERNAL rather than a final message with finish_reason "error": a failed
request is a failed call — every gRPC client, interceptor and metric sees the
status, and our SDK raises ``InternalError`` after the tokens already yielded.
"abort" (the request was aborted via ``Abort``) is a normal finish, status OK.

Flip, Scale (admin) ─▶ admin.flip / admin.scale (control_plane/elastic.py)
SetPolicy (admin) ─▶ admin.set_policy (worker_id: an id, "decode" = every decode worker, empty = every
prefill worker): unknown worker ─▶ NOT_FOUND; bad key or value, or a key of the other role ─▶
INVALID_ARGUMENT "key: message" (+ tetriserve-field=key); a worker that did not answer ─▶ DEADLINE_EXCEEDED.

With API keys configured every call but Health needs ``authorization: Bearer <key>`` metadata
(``grpc_auth``: UNAUTHENTICATED, or RESOURCE_EXHAUSTED over a key's quota); TLS from ``security.tls``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import grpc
import grpc.aio

from tetriserve.client.errors import FIELD_METADATA_KEY, RETRY_AFTER_METADATA_KEY
from tetriserve.common.errors import InvalidRequestError
from tetriserve.common.request import Request
from tetriserve.frontdoor.admission import Draining, Overloaded
from tetriserve.frontdoor.backend import AdminClient, RequestRouter
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.frontdoor.deltas import TextDelta
from tetriserve.frontdoor.grpc_auth import ApiKeyInterceptor
from tetriserve.frontdoor.http_limits import DEFAULT_MAX_BODY_BYTES
from tetriserve.frontdoor.policy_admin import UnknownWorkerError, describe_target
from tetriserve.frontdoor.security import FrontDoorSecurity
from tetriserve.protos import tetriserve_pb2 as pb
from tetriserve.protos import tetriserve_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)
GENERATE_ROUTE = "/tetriserve.v1.TetriServe/Generate"  # the root span's route (``observability/request_span.py``)

_OPTIONAL = ("min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "min_p")
_SAMPLING = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop_token_ids",
    "stop",
    "logit_bias",
    "allowed_token_ids",
    *_OPTIONAL,
)
_SLO = ("ttft_ms", "tbt_ms", "jct_ms")
_RENAME = {name: f"sampling.{name}" for name in _SAMPLING}


async def _invalid(context: grpc.aio.ServicerContext, exc: InvalidRequestError) -> None:
    """A request field's refusal: INVALID_ARGUMENT, the field named in the trailing metadata."""
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, str(exc), trailing_metadata=((FIELD_METADATA_KEY, exc.field),)
    )


async def _refuse(context: grpc.aio.ServicerContext, exc: Overloaded) -> None:
    await context.abort(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        exc.message,
        trailing_metadata=((RETRY_AFTER_METADATA_KEY, str(exc.retry_after_s)),),
    )


class TetriServeServicer(pb_grpc.TetriServeServicer):
    """Implements ``tetriserve.v1.TetriServe`` with a ``FrontDoor``."""

    def __init__(self, front: FrontDoor) -> None:
        self._front = front

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        started = time.monotonic()
        rid = request.request_id or uuid.uuid4().hex
        try:
            self._front.check_admission(started, GENERATE_ROUTE)  # a flood is refused before it costs a tokenization
            req = await self._to_request(rid, request)
            req.trace = _metadata(context, "traceparent")  # the client's trace, if it sent one
            admitted = self._front.admitted_stream(req, started, GENERATE_ROUTE)
        except InvalidRequestError as exc:
            logger.debug("request %s rejected: %s", rid, exc)
            await _invalid(context, exc)
        except Overloaded as exc:
            await _refuse(context, exc)
        except Draining as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        try:
            async with aclosing(admitted) as deltas:
                async for delta in deltas:
                    if delta.error is None:
                        yield _to_response(delta)
                        continue
                    if delta.token_ids or delta.text:
                        yield pb.GenerateResponse(request_id=rid, token_ids=delta.token_ids, text=delta.text)
                    logger.warning("request %s failed in the backend: %s", rid, delta.error)
                    code = grpc.StatusCode.UNAVAILABLE if delta.unavailable else grpc.StatusCode.INTERNAL
                    await context.abort(code, f"request {rid} failed: {delta.error}")
        except grpc.aio.AbortError:
            raise
        except InvalidRequestError as exc:  # its request id is in flight here already (``FrontDoor.stream``)
            await _invalid(context, exc)
        except Overloaded as exc:  # every prefill worker is full (the GlobalScheduler's bound), before any token
            await _refuse(context, exc)
        except ConnectionError as exc:
            logger.warning("request %s: backend unavailable: %s", rid, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"backend unavailable: {exc}")
        except Exception as exc:
            logger.exception("request %s: unexpected error", rid)
            await context.abort(grpc.StatusCode.INTERNAL, f"request {rid} failed: {type(exc).__name__}: {exc}")

    async def _to_request(self, rid: str, request: pb.GenerateRequest) -> Request:
        front = self._front
        front.check_model(request.model)
        which = request.WhichOneof("prompt")
        if which == "text":
            prompt = await front.encode(request.text)
        elif which == "token_ids":
            prompt = tuple(request.token_ids.ids)
        else:
            raise InvalidRequestError("prompt", "set either text or token_ids")
        s = request.sampling
        return front.build_request(
            rid,
            prompt,
            max_tokens=s.max_tokens if s.HasField("max_tokens") else None,
            temperature=s.temperature if s.HasField("temperature") else None,
            top_p=s.top_p if s.HasField("top_p") else None,
            top_k=s.top_k if s.HasField("top_k") else None,
            seed=s.seed if s.HasField("seed") else None,
            stop_token_ids=tuple(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
            stop=tuple(s.stop),
            logit_bias=dict(s.logit_bias),
            allowed_token_ids=tuple(s.allowed_token_ids) or None,
            **{name: getattr(s, name) for name in _OPTIONAL if s.HasField(name)},
            slo={n: getattr(request.slo, n) if request.slo.HasField(n) else None for n in _SLO},
            priority=request.priority,
            rename=_RENAME,
        )

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        if not request.request_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "request_id: must not be empty",
                trailing_metadata=((FIELD_METADATA_KEY, "request_id"),),
            )
        aborted = await self._front.backend.abort(request.request_id)
        logger.info("abort %s via gRPC: %s", request.request_id, aborted)
        return pb.AbortResponse(aborted=aborted)

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        serving = not self._front.gate.closed and await self._front.admin.healthy()
        return pb.HealthResponse(serving=serving, model=self._front.model_name)

    async def ClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatusResponse:
        status = await self._front.admin.status()
        reply = pb.ClusterStatusResponse(
            model=status.model,
            requests_in_flight=status.requests_in_flight,
            dashboard_url=status.dashboard_url,
            preset=status.preset,
            mode=status.mode,
        )
        for w in status.workers:
            reply.workers.add(
                worker_id=w.worker_id,
                role=w.role,
                state=w.state,
                load=dict(w.load),
                policy=dict(w.policy),
                incarnation=w.incarnation,
                restarts=w.restarts,
                health=w.health,
                lifecycle=w.lifecycle,
                flips=w.flips,
                last_flip_ms=None if w.last_flip_s is None else w.last_flip_s * 1e3,
                last_flip_switch_ms=None if w.last_flip_switch_s is None else w.last_flip_switch_s * 1e3,
                last_flip_engine_ms=None if w.last_flip_engine_s is None else w.last_flip_engine_s * 1e3,
                transport=w.transport,
            )
        return reply

    async def Flip(self, request: pb.FlipRequest, context: grpc.aio.ServicerContext) -> pb.FlipResponse:
        try:
            said = await self._front.admin.flip(request.worker_id, request.role)
        except Exception as exc:
            await _abort_admin(context, exc, "worker_id")
        logger.info("flip %s %s: %s", request.worker_id, request.role, said)
        return pb.FlipResponse(message=said)

    async def Scale(self, request: pb.ScaleRequest, context: grpc.aio.ServicerContext) -> pb.ScaleResponse:
        prefill = request.prefill if request.HasField("prefill") else None
        decode = request.decode if request.HasField("decode") else None
        try:
            said = await self._front.admin.scale(prefill, decode)
        except Exception as exc:
            await _abort_admin(context, exc, "")
        logger.info("scale prefill=%s decode=%s: %s", prefill, decode, "; ".join(said))
        return pb.ScaleResponse(actions=said)

    async def SetPolicy(self, request: pb.SetPolicyRequest, context: grpc.aio.ServicerContext) -> pb.SetPolicyResponse:
        target = describe_target(request.worker_id)
        try:
            workers = await self._front.admin.set_policy(request.worker_id or None, dict(request.changes))
        except UnknownWorkerError as exc:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, str(exc), trailing_metadata=((FIELD_METADATA_KEY, "worker_id"),)
            )
        except InvalidRequestError as exc:
            logger.info("policy change %s on %s rejected: %s", dict(request.changes), target, exc)
            await _invalid(context, exc)
        except ValueError as exc:  # a backend that did not name the field
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{target} did not answer the policy change")
        reply = pb.SetPolicyResponse()
        for w in workers:
            reply.workers.add(worker_id=w.worker_id, role=w.role, policy=dict(w.policy))
        return reply


async def _abort_admin(context: grpc.aio.ServicerContext, exc: Exception, lookup_field: str) -> None:
    """An admin order's refusal in gRPC's shape: NOT_FOUND (no such worker), INVALID_ARGUMENT (a bad field),
    FAILED_PRECONDITION (cannot be done now, with the reason); anything else is a bug and propagates."""
    if isinstance(exc, LookupError):
        meta = ((FIELD_METADATA_KEY, lookup_field),) if lookup_field else None
        await context.abort(grpc.StatusCode.NOT_FOUND, str(exc), trailing_metadata=meta)
    if isinstance(exc, InvalidRequestError):
        await _invalid(context, exc)
    if isinstance(exc, ValueError):
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    raise exc


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None


def _to_response(delta: TextDelta) -> pb.GenerateResponse:
    msg = pb.GenerateResponse(request_id=delta.request_id, token_ids=delta.token_ids, text=delta.text)
    for entry in delta.logprobs or ():
        lp = msg.logprobs.add(token_id=entry.token_id, token=entry.token)
        if entry.logprob is not None:
            lp.logprob = entry.logprob
        for token_id, token, logprob in entry.top:
            lp.top.add(token_id=token_id, token=token, logprob=logprob)
    if delta.ttft_ms is not None:
        msg.ttft_ms = delta.ttft_ms
    if delta.finish_reason is not None:
        msg.finish_reason = delta.finish_reason
        msg.usage.prompt_tokens = delta.prompt_tokens
        msg.usage.completion_tokens = delta.completion_tokens
        if delta.e2e_ms is not None:
            msg.e2e_ms = delta.e2e_ms
        msg.metrics.update(delta.metrics)
    return msg


async def start_grpc_server(
    backend: RequestRouter,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    admin: AdminClient | None = None,
    front: FrontDoor | None = None,
    max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
    security: FrontDoorSecurity | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC gateway in the running event loop; return the server and the bound port.

    ``port=0`` picks a free port. Pass ``front`` to share one tokenizer with the
    HTTP gateway. Stop with ``await server.stop(grace)``. A request message over
    ``max_message_bytes`` is refused by gRPC itself with RESOURCE_EXHAUSTED.
    """
    if front is None:
        front = await asyncio.to_thread(FrontDoor, backend, None, None, admin)
    options = [
        ("grpc.so_reuseport", 0),  # fail loudly if the port is taken
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    security = security or FrontDoorSecurity()
    interceptors = [ApiKeyInterceptor(security)] if security.keys is not None else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    # the generated registration, declared here as it is called (the generated module has no annotations)
    add_servicer: Callable[[TetriServeServicer, grpc.aio.Server], None] = pb_grpc.add_TetriServeServicer_to_server
    add_servicer(TetriServeServicer(front), server)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        if security.tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([security.tls.pems()]))
    except RuntimeError as exc:
        raise OSError(f"cannot bind the gRPC gateway to {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot bind the gRPC gateway to {address}")
    await server.start()
    tls = "TLS" if security.tls is not None else "plaintext"
    logger.info("gRPC gateway serving %s on %s (port %s, %s)", front.model_name, host, bound, tls)
    return server, bound
