"""The HTTP front door's API key check: an ASGI wrapper in front of every route but the open ones.

    request ─▶ open path? (/health, /ready, /metrics unless security.metrics_require_key) ─▶ the app
           └─▶ KeyTable.check(Authorization header)
                  MISSING / INVALID ─▶ 401 {"error": {..., "type": "invalid_request_error",
                                                      "code": "invalid_api_key"}} + WWW-Authenticate: Bearer
                  RATE_LIMITED      ─▶ 429 {"error": {..., "type": "rate_limit_error",
                                                      "code": "rate_limit_exceeded"}} + Retry-After (s)
                  ALLOWED           ─▶ the app (scope["state"]["api_key_name"] = the key's name)

Every path that is not open needs a key, including ones added later (a new route is guarded by default):
the metrics route needs no code of its own, ``FrontDoorSecurity.metrics_require_key`` decides for it.
The body of a refused request is read and dropped first (as ``http_limits`` does), up to the body limit,
which wraps this guard.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from tetriserve.common.errors import error_body
from tetriserve.frontdoor.http_limits import _drain
from tetriserve.frontdoor.key_table import AuthOutcome, AuthResult
from tetriserve.frontdoor.security import FrontDoorSecurity


class ApiKeyGuard:
    """Wraps ``app``: a request to a guarded path without a valid key gets OpenAI's 401 (or 429 over quota)."""

    def __init__(self, app: ASGIApp, security: FrontDoorSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.security.keys
        if keys is None or scope["type"] != "http" or self.security.path_is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        result = keys.check(_header(scope, b"authorization"))
        if result.allowed:
            scope.setdefault("state", {})["api_key_name"] = result.key_name
            await self.app(scope, receive, send)
            return
        await _drain(receive)
        await refuse(send, result)


async def refuse(send: Send, result: AuthResult) -> None:
    """Send the refusal of ``result`` (401, or 429 with Retry-After) in OpenAI's error shape."""
    headers = [(b"content-type", b"application/json")]
    if result.outcome is AuthOutcome.RATE_LIMITED:
        status = 429
        body = error_body(result.message(), "rate_limit_error", None, "rate_limit_exceeded")
        headers.append((b"retry-after", str(result.retry_after_whole_s).encode()))
    else:
        status = 401
        body = error_body(result.message(), "invalid_request_error", None, "invalid_api_key")
        headers.append((b"www-authenticate", b"Bearer"))
    data = json.dumps(body).encode()
    headers.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
