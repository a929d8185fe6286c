"""How the commands that call a running service authenticate.

    tetriserve generate|status|policy|flip|scale ... [--api-key KEY] [--tls] [--tls-ca PEM]

A client command's `--api-key` defaults to ``$TETRISERVE_API_KEY``; `--tls-ca` (a CA or the server's
certificate) implies `--tls`, which alone verifies the server against the system's root certificates. What
`serve` enforces (keys, quotas, TLS) is set by its config flags (``cli/config_flags.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, Unpack

from tetriserve.client.credentials import API_KEY_ENV

if TYPE_CHECKING:
    import grpc

    from tetriserve.client import RetryPolicy, TetriServeClient


class ClientOptions(TypedDict, total=False):
    """The ``TetriServeClient`` arguments a command may set besides the target, key and TLS."""

    retry: RetryPolicy | None
    timeout: float | None
    credentials: grpc.ChannelCredentials | None
    channel_options: Sequence[tuple[str, object]]


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """`--api-key`, `--tls` and `--tls-ca` of a command that calls a running service."""
    parser.add_argument("--api-key", default=None, help=f"API key to send (default: ${API_KEY_ENV})")
    parser.add_argument("--tls", action="store_true", help="TLS, verifying the server against the system's roots")
    parser.add_argument("--tls-ca", default=None, metavar="PEM", help="TLS, verifying the server against this CA")


def connect(args: argparse.Namespace, **kwargs: Unpack[ClientOptions]) -> TetriServeClient:
    """A ``TetriServeClient`` to ``args.target`` with the command's key and TLS flags."""
    from tetriserve.client import TetriServeClient

    return TetriServeClient(
        args.target,
        api_key=getattr(args, "api_key", None),
        tls=bool(getattr(args, "tls", False)),
        root_certificates=getattr(args, "tls_ca", None),
        **kwargs,
    )
