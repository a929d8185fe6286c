"""Fixtures shared by the transport tests: a closing factory of every backend, sender/receiver pairs."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.transport_support import unique
from tetriserve.transport.api import Transport
from tetriserve.transport.auto import AutoTransport
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.registry import make_transport
from tetriserve.transport.shm import ShmTransport
from tetriserve.transport.tcp import TcpTransport

SOCKET_BACKENDS = ("tcp", "shm", "ucx", "nccl", "auto")  # addressed by host:port; the receiver acknowledges every frame


@pytest.fixture
def make() -> Iterator[Callable[..., Any]]:
    """Factory of transports of every backend; everything it made is closed at teardown."""
    opened: list[Transport] = []

    def _make(kind: str, **kwargs: Any) -> Any:
        t: Transport
        if kind == "tcp":
            t = TcpTransport(**kwargs)
        elif kind == "shm":
            t = ShmTransport(**kwargs)
        elif kind == "auto":  # a host of its own unless told: its peers are reached over UCX
            t = AutoTransport(**{"host": unique("host"), **kwargs})
        elif kind in ("ucx", "nccl"):
            if kind == "nccl":  # endpoints of one process share its GPU, which NCCL refuses ("Duplicate GPU
                kwargs.setdefault("backend", "gloo")  # detected", seen on an H100): the same code path over gloo
            t = make_transport(kind, kwargs.pop("listen", "127.0.0.1:0"), **kwargs)
        else:
            t = InProcTransport(unique(), **kwargs)
        opened.append(t)
        return t

    yield _make
    for t in opened:
        t.close()


@pytest.fixture(params=["tcp", "shm", "inproc", "ucx", "nccl", "auto"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pair(make: Callable[..., Any], kind: str) -> tuple[Any, Any]:
    """(sender, receiver) of the parametrized backend."""
    return make(kind), make(kind)


@pytest.fixture
def dead_port() -> Iterator[str]:
    """An address nothing listens on: a bound, non-listening socket holds the port so no one else takes it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
