"""How the commands that call a running service authenticate.

    tetriserve generate|status|policy|flip|scale ... [--api-key KEY] [--tls] [--tls-ca PEM]

A client command's `--api-key` defaults to ``$TETRISERVE_API_KEY``; `--tls-ca` (a CA or the server's
certificate) implies `--tls`, which alone verifies the server against the system's root certificates. What
`serve` enforces (keys, quotas, TLS) is set by its config flags (``cli/config_flags.py``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tetriserve.client.credentials import API_KEY_ENV

if TYPE_CHECKING:
    from tetriserve.client import TetriServeClient


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """`--api-key`, `--tls` and `--tls-ca` of a command that calls a running service."""
    parser.add_argument("--api-key", default=None, help=f"API key to send (default: ${API_KEY_ENV})")
    parser.add_argument("--tls", action="store_true", help="TLS, verifying the server against the system's roots")
    parser.add_argument("--tls-ca", default=None, metavar="PEM", help="TLS, verifying the server against this CA")


def connect(args: argparse.Namespace, **kwargs: Any) -> TetriServeClient:
    """A ``TetriServeClient`` to ``args.target`` with the command's key and TLS flags."""
    from tetriserve.client import TetriServeClient

    return TetriServeClient(
        args.target,
        api_key=getattr(args, "api_key", None),
        tls=bool(getattr(args, "tls", False)),
        root_certificates=getattr(args, "tls_ca", None),
        **kwargs,
    )
