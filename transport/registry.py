"""Backend registry: the transport name in the cluster config picks one of these."""

from __future__ import annotations

from collections.abc import Callable

from tetriserve.transport.api import Transport
from tetriserve.transport.auto import AutoTransport, ucx_port
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.mock import MockTransport
from tetriserve.transport.shm import ShmTransport
from tetriserve.transport.tcp import TcpTransport

# A backend's factory: the listen address, then the cluster config's options as given (each constructor checks
# its own keywords and refuses one it does not know)
Factory = Callable[..., Transport]


def _ucx(listen: str, **options: object) -> Transport:
    from tetriserve.transport.ucx import UcxTransport  # imports ucxx (and sets its UCX_* defaults) on first use

    factory: Factory = UcxTransport
    return factory(listen, **options)


def _auto(listen: str, across_hosts: bool = False, **options: object) -> Transport:
    """The default: an shm endpoint, with a UCX listener beside it where the cluster spans hosts."""
    factory: Factory = AutoTransport if across_hosts else ShmTransport
    return factory(listen, **options)


def _nccl(listen: str, **options: object) -> Transport:
    from tetriserve.transport.nccl import NcclTransport  # imports torch.distributed on first use

    factory: Factory = NcclTransport
    return factory(listen, **options)


BACKENDS: dict[str, Factory] = {
    "tcp": lambda listen, **options: TcpTransport(listen, **options),
    "shm": lambda listen, **options: ShmTransport(listen, **options),
    "auto": _auto,
    "inproc": lambda listen, **options: InProcTransport(listen, **options),
    "mock": lambda listen, **options: MockTransport(listen, **options),
    "ucx": _ucx,
    "nccl": _nccl,
}


def backend_of(address: str) -> str:
    """The backend an endpoint's address belongs to (``status`` names it per worker)."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        return "tcp"
    return f"{scheme}+ucx" if ucx_port(rest) is not None else scheme


def make_transport(name: str, listen: str, **options: object) -> Transport:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"transport: unknown backend {name!r}; known: {sorted(BACKENDS)}") from None
    return factory(listen, **options)
