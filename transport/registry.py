"""Backend registry: the transport name in the cluster config picks one of these."""

from __future__ import annotations

from collections.abc import Callable

from tetriserve.transport.api import Transport
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.mock import MockTransport
from tetriserve.transport.shm import ShmTransport
from tetriserve.transport.tcp import TcpTransport

BACKENDS: dict[str, Callable[[str], Transport]] = {
    "tcp": lambda listen: TcpTransport(listen),
    "shm": lambda listen: ShmTransport(listen),
    "inproc": lambda listen: InProcTransport(listen),
    "mock": lambda listen: MockTransport(listen),
}


def backend_of(address: str) -> str:
    """The backend an endpoint's address belongs to (``status`` names it per worker)."""
    scheme, sep, _ = address.partition("://")
    return scheme if sep else "tcp"


def make_transport(name: str, listen: str) -> Transport:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"transport: unknown backend {name!r}; known: {sorted(BACKENDS)}") from None
    return factory(listen)
