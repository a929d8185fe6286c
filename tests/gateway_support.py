"""Both front doors (OpenAI HTTP and gRPC) over a ``FakeBackend``, in a loop thread, and the HTTP tests'
module-scoped fixtures over them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fakes import FakeBackend, LoopThread, tokenizer_dir
from tetriserve.client import TetriServeClient
from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.frontdoor.gateway_grpc import start_grpc_server
from tetriserve.frontdoor.gateway_http import start_http_server
from tetriserve.frontdoor.http_limits import DEFAULT_MAX_BODY_BYTES
from tetriserve.frontdoor.security import FrontDoorSecurity


@dataclass
class FakeFrontDoors:
    backend: FakeBackend
    front: FrontDoor
    loop: LoopThread
    url: str  # the HTTP gateway ("" when not started)
    target: str  # the gRPC gateway ("" when not started)


@contextmanager
def fake_front_doors(
    *,
    limits: AdmissionConfig | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    http: bool = True,
    grpc: bool = True,
    security: FrontDoorSecurity | None = None,
) -> Iterator[FakeFrontDoors]:
    """The gateways asked for, sharing one ``FrontDoor`` over a fresh ``FakeBackend``, until the ``with`` ends."""
    backend = FakeBackend(tokenizer_dir())
    front = FrontDoor(backend, limits=limits)
    loop = LoopThread()
    http_handle = grpc_server = None
    url = target = ""
    if http:
        http_handle = loop.run(
            start_http_server(backend, "127.0.0.1", 0, front=front, max_body_bytes=max_body_bytes, security=security)
        )
        url = http_handle.url
    if grpc:
        grpc_server, port = loop.run(
            start_grpc_server(backend, "127.0.0.1", 0, front=front, max_message_bytes=max_body_bytes, security=security)
        )
        target = f"127.0.0.1:{port}"
    try:
        yield FakeFrontDoors(backend, front, loop, url, target)
    finally:
        if http_handle is not None:
            loop.run(http_handle.stop())
        if grpc_server is not None:
            loop.run(grpc_server.stop(None))
        loop.stop()


@pytest.fixture(scope="module")
def env() -> Iterator[FakeFrontDoors]:
    """Both front doors over one ``FakeBackend``, for a test module."""
    with fake_front_doors() as doors:
        yield doors


@pytest.fixture()
def backend(env: FakeFrontDoors) -> FakeBackend:
    env.backend.reset()
    return env.backend


@pytest.fixture()
def client(env: FakeFrontDoors) -> Iterator[TetriServeClient]:
    with TetriServeClient(env.target, timeout=10) as c:
        yield c


@pytest.fixture()
def http(env: FakeFrontDoors) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=env.url, timeout=10) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error of a response that must have ``status``."""
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def sse_events(response: httpx.Response) -> list[Any]:
    """The decoded ``data:`` payloads of an SSE response (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
