"""Backend registry: the transport name in the cluster config picks one of these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tetriserve.transport.api import Transport
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.mock import MockTransport
from tetriserve.transport.shm import ShmTransport
from tetriserve.transport.tcp import TcpTransport


def _ucx(listen: str, **options: Any) -> Transport:
    from tetriserve.transport.ucx import UcxTransport  # imports ucxx (and sets its UCX_* defaults) on first use

    return UcxTransport(listen, **options)


def _nccl(listen: str, **options: Any) -> Transport:
    from tetriserve.transport.nccl import NcclTransport  # imports torch.distributed on first use

    return NcclTransport(listen, **options)


BACKENDS: dict[str, Callable[..., Transport]] = {
    "tcp": lambda listen, **options: TcpTransport(listen, **options),
    "shm": lambda listen, **options: ShmTransport(listen, **options),
    "inproc": lambda listen, **options: InProcTransport(listen, **options),
    "mock": lambda listen, **options: MockTransport(listen, **options),
    "ucx": _ucx,
    "nccl": _nccl,
}


def backend_of(address: str) -> str:
    """The backend an endpoint's address belongs to (``status`` names it per worker)."""
    scheme, sep, _ = address.partition("://")
    return scheme if sep else "tcp"


def make_transport(name: str, listen: str, **options: Any) -> Transport:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"transport: unknown backend {name!r}; known: {sorted(BACKENDS)}") from None
    return factory(listen, **options)
