"""Limits and validation at both front doors: body size (413 / RESOURCE_EXHAUSTED), chat roles and content,
the admission bound (429 / RESOURCE_EXHAUSTED), at the front door's gate or at placement."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.fakes import wait_until
from tests.gateway_support import FakeFrontDoors, error_of, fake_front_doors
from tetriserve.client import ResourceExhausted, TetriServeClient
from tetriserve.client.retry import NO_RETRY, RetryPolicy
from tetriserve.common.admission_config import AdmissionConfig

LIMIT = 64 << 10
QUEUE = 2  # requests that may wait to start


@pytest.fixture(scope="module")
def servers() -> Iterator[FakeFrontDoors]:
    # a bound of 50 ms: the allowed queue is QUEUE whatever start rate earlier tests left measured
    with fake_front_doors(limits=AdmissionConfig(min_queue=QUEUE, max_wait_s=0.05), max_body_bytes=LIMIT) as doors:
        yield doors


@pytest.fixture()
def http(servers: FakeFrontDoors) -> Iterator[httpx.Client]:
    servers.backend.reset()
    with httpx.Client(base_url=servers.url, timeout=30) as c:
        yield c


def test_a_body_over_the_limit_gets_413_not_a_reset(http: httpx.Client) -> None:
    big = b'{"model": "tiny-test", "prompt": "' + b"x" * (4 * LIMIT) + b'"}'
    err = error_of(http.post("/v1/completions", content=big, headers={"content-type": "application/json"}), 413)
    assert err["code"] == "request_too_large" and str(LIMIT) in err["message"]


def test_a_chunked_body_over_the_limit_gets_413(http: httpx.Client) -> None:
    def pieces() -> Iterator[bytes]:
        yield b'{"model": "tiny-test", "prompt": "'
        for _ in range(8):
            yield b"y" * (LIMIT // 2)
        yield b'"}'

    r = http.post("/v1/completions", content=pieces(), headers={"content-type": "application/json"})
    assert error_of(r, 413)["code"] == "request_too_large"


def test_bodies_under_the_limit_are_served_chunked_or_not(http: httpx.Client) -> None:
    body = b'{"model": "tiny-test", "prompt": "hello", "max_tokens": 2}'
    assert http.post("/v1/completions", content=body, headers={"content-type": "application/json"}).status_code == 200

    def pieces() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    r = http.post("/v1/completions", content=pieces(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert http.get("/health").status_code == 200  # a GET without a body passes through


def chat(http: httpx.Client, messages: list[dict[str, Any]]) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": "tiny-test", "messages": messages, "max_tokens": 2})


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool"])
def test_openai_roles_are_served(http: httpx.Client, role: str) -> None:
    r = chat(http, [{"role": role, "content": "hi"}, {"role": "user", "content": "hello"}])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("messages", "field", "words"),
    [
        ([{"role": "wizard", "content": "hi"}], "role", "unknown role 'wizard'"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content[0].type", "text parts"),
        ([{"role": "user", "content": [{"type": "text"}]}], "content[0].text", "needs its text"),
        ([{"role": "user", "content": None}], "messages[0].content", "needs content"),
        ([{"role": "user"}], "messages[0].content", "needs content"),
        ([{"content": "no role"}], "role", "Field required"),
        ([], "messages", "at least one message"),
    ],
)
def test_malformed_chat_messages_get_400_naming_the_field(
    http: httpx.Client, messages: list[dict[str, Any]], field: str, words: str
) -> None:
    err = error_of(chat(http, messages), 400)
    assert err["type"] == "invalid_request_error"
    assert field in (err["param"] or ""), err
    assert words in err["message"], err


def test_an_assistant_turn_may_have_no_content(http: httpx.Client) -> None:
    r = chat(http, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert r.status_code == 200, r.text


def test_a_grpc_message_over_the_limit_is_resource_exhausted(servers: FakeFrontDoors) -> None:
    with TetriServeClient(servers.target, retry=NO_RETRY) as client:
        with pytest.raises(ResourceExhausted):
            client.complete(prompt="z" * (2 * LIMIT), max_tokens=2)
        assert client.complete(prompt="hello", max_tokens=2).text is not None


def test_requests_past_the_admission_bound_are_refused_at_once_and_served_after(
    servers: FakeFrontDoors, http: httpx.Client
) -> None:
    # the admitted ones wait for their tokens (a stream's headers come within Generation.open's window)
    servers.backend.behavior.token_delay_s = 2.0
    body = {"model": "tiny-test", "prompt": "hello there", "max_tokens": 3, "stream": True}
    with ExitStack() as held, httpx.Client(base_url=servers.url, timeout=30) as other:
        for _ in range(QUEUE):
            r = held.enter_context(other.stream("POST", "/v1/completions", json=body))
            assert r.status_code == 200
        refused = http.post("/v1/completions", json=body)
        err = error_of(refused, 429)
        assert err["code"] == "overloaded" and "retry" in err["message"]
        assert int(refused.headers["retry-after"]) >= 1
        with TetriServeClient(servers.target, retry=NO_RETRY) as client, pytest.raises(ResourceExhausted) as exhausted:
            client.complete(prompt="hello", max_tokens=2)
        assert exhausted.value.retry_after_s is not None and exhausted.value.retry_after_s >= 1
    servers.backend.behavior.token_delay_s = 0.0
    wait_until(lambda: servers.front.gate.inflight == 0, what="the held streams to end")
    assert http.post("/v1/completions", json={**body, "stream": False}).status_code == 200
    assert servers.front.gate.stats()["refused"] == 2


def test_the_sdk_retries_a_refusal_when_asked_after_the_retry_after(
    servers: FakeFrontDoors, http: httpx.Client
) -> None:
    servers.backend.behavior.token_delay_s = 2.0
    body = {"model": "tiny-test", "prompt": "hello there", "max_tokens": 3, "stream": True}
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, retry_refused=True)
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=servers.url, timeout=30) as other, ExitStack() as held:
        for _ in range(QUEUE):
            held.enter_context(other.stream("POST", "/v1/completions", json=body))
        refused = servers.front.gate.refused
        with TetriServeClient(servers.target, retry=policy) as client:
            later = pool.submit(client.complete, prompt="hello", max_tokens=2)
            wait_until(lambda: servers.front.gate.refused > refused, what="the first attempt to be refused")
            servers.backend.behavior.token_delay_s = 0.0
            held.close()  # the held streams end: room for the retry
            assert later.result(timeout=20).finish_reason == "length"


def test_a_refusal_at_placement_is_429_or_resource_exhausted_before_any_token(
    servers: FakeFrontDoors, http: httpx.Client
) -> None:
    """Every prefill worker full (the GlobalScheduler's per-worker bound): the backend raises ``Overloaded``
    before its first chunk, and the response has not started: a streamed request gets its 429 too."""
    servers.backend.behavior.full_retry_after_s = 7
    for stream in (False, True):
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": stream})
        err = error_of(r, 429)
        assert err["code"] == "overloaded" and r.headers["retry-after"] == "7"
    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True}
    assert error_of(http.post("/v1/chat/completions", json=chat), 429)["code"] == "overloaded"
    with TetriServeClient(servers.target, retry=NO_RETRY) as client, pytest.raises(ResourceExhausted) as exhausted:
        client.complete(prompt="hello", max_tokens=2)
    assert exhausted.value.retry_after_s == 7
    servers.backend.behavior.full_retry_after_s = None
    assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
    wait_until(lambda: servers.front.gate.inflight == 0, what="every ticket released")


def test_http_connections_get_tcp_nodelay() -> None:
    """A kept-alive HTTP connection must not hold a stream's small writes for the client's delayed ACK (Nagle):
    asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP, which the gateway's listener is."""
    import asyncio
    import socket

    from tetriserve.frontdoor.gateway_http import _listen

    async def go() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=_listen("127.0.0.1", 0, socket.AF_INET))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(seen, 5)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(go()) != 0
