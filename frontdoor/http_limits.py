"""The HTTP front door's body limit: an ASGI wrapper that answers 413 before the app parses anything.

    request ─▶ Content-Length over the limit? ─▶ the body is read and dropped, then 413 (Connection: close)
           └─▶ no Content-Length (chunked)    ─▶ buffered up to the limit; past it, the same 413
           └─▶ otherwise                      ─▶ the app, unchanged

The body is drained before the 413 goes out so that a client still sending
reads the answer instead of a reset connection (a server that closes on an
unread body leaves the client writing into a closed socket).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tetriserve.common.config import DEFAULT_MAX_REQUEST_BODY_MB
from tetriserve.common.errors import error_body


def megabytes(mb: float) -> int:
    """``mb`` MiB in bytes (the config's ``max_request_body_mb`` as both front doors take it)."""
    return int(mb * (1 << 20))


DEFAULT_MAX_BODY_BYTES = megabytes(DEFAULT_MAX_REQUEST_BODY_MB)


class BodyLimit:
    """Wraps ``app``: a request body over ``limit_bytes`` gets an OpenAI-shaped 413."""

    def __init__(self, app: ASGIApp, limit_bytes: int) -> None:
        self.app = app
        self.limit = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.limit:
                await _drain(receive)
                await self._refuse(send, declared)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[Message] = []
        size = 0
        while True:  # chunked: read it all (up to the limit) before the app sees it
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                if message.get("more_body", False):
                    await _drain(receive)
                await self._refuse(send, None)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, declared: int | None) -> None:
        size = f"{declared} bytes" if declared is not None else "more than that"
        message = f"request body is {size}; the limit is {self.limit} bytes (max_request_body_mb)"
        body = json.dumps(error_body(message, "invalid_request_error", None, "request_too_large")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive) -> None:
    """Read the rest of the request body and drop it."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
