"""Fixtures of the OpenAI HTTP gateway tests: one uvicorn server per module over a ``FakeBackend``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fakes import FakeBackend, LoopThread, tokenizer_dir
from tetriserve.control_plane.frontdoor import FrontDoor
from tetriserve.control_plane.gateway_http import HttpServerHandle, start_http_server


@dataclass
class HttpEnv:
    backend: FakeBackend
    front: FrontDoor
    url: str


@pytest.fixture(scope="module")
def env() -> Iterator[HttpEnv]:
    backend = FakeBackend(tokenizer_dir())
    front = FrontDoor(backend)
    loop = LoopThread()
    handle: HttpServerHandle = loop.run(start_http_server(backend, "127.0.0.1", 0, front=front))
    yield HttpEnv(backend, front, handle.url)
    loop.run(handle.stop())
    loop.stop()


@pytest.fixture()
def backend(env: HttpEnv) -> FakeBackend:
    env.backend.reset()
    return env.backend


@pytest.fixture()
def http(env: HttpEnv) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=env.url, timeout=10) as c:
        yield c


def sse_events(response: httpx.Response) -> list[Any]:
    """The decoded ``data:`` payloads of an SSE response (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
