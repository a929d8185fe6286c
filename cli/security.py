"""The CLI's security flags: what `serve` enforces, and how the commands that call a service authenticate.

    tetriserve serve    [--api-key KEY ...] [--api-keys-file PATH] [--key-rate R] [--tls-cert PEM --tls-key PEM]
                        [--metrics-require-key] [--dashboard-host HOST]
    tetriserve generate|status|policy|flip|scale ... [--api-key KEY] [--tls] [--tls-ca PEM]

`--api-key` on `serve` is repeatable and takes comma lists; it replaces the config file's
``security.api_keys`` (the keys file and ``$TETRISERVE_API_KEY`` are added to them). A client command's
`--api-key` defaults to ``$TETRISERVE_API_KEY``; `--tls-ca` (a CA or the server's certificate) implies
`--tls`, which alone verifies the server against the system's root certificates.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tetriserve.client.credentials import API_KEY_ENV

if TYPE_CHECKING:
    from tetriserve.client import TetriServeClient

# flag -> (dotted ClusterConfig field, type, help)
SERVE_SECURITY_FLAGS: dict[str, tuple[str, type, str]] = {
    "--api-keys-file": ("security.api_keys_file", str, "file of API keys, one a line: KEY [rate=5/s] [burst=N]"),
    "--key-rate": ("security.rate_per_s", float, "requests a second each API key may make (default: unlimited)"),
    "--tls-cert": ("security.tls_cert", str, "PEM certificate: both front doors serve TLS (with --tls-key)"),
    "--tls-key": ("security.tls_key", str, "PEM private key of --tls-cert"),
    "--dashboard-host": ("security.dashboard_host", str, "address the Ray dashboard binds to (default 127.0.0.1)"),
}


def add_serve_security_flags(parser: argparse.ArgumentParser) -> None:
    """`serve`'s key, quota, TLS and dashboard flags."""
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help=f"API key clients must send (repeatable, or a comma list; also ${API_KEY_ENV}); none: open doors",
    )
    for flag, (_, typ, text) in SERVE_SECURITY_FLAGS.items():
        parser.add_argument(flag, type=typ, default=None, help=text)
    parser.add_argument(
        "--metrics-require-key", action="store_true", default=None, help="GET /metrics needs an API key too"
    )


def serve_security_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The dotted config overrides of `serve`'s security flags (None: not given)."""
    overrides: dict[str, Any] = {
        dotted: getattr(args, flag[2:].replace("-", "_")) for flag, (dotted, _, _) in SERVE_SECURITY_FLAGS.items()
    }
    if args.api_key:
        overrides["security.api_keys"] = [k.strip() for arg in args.api_key for k in arg.split(",") if k.strip()]
    overrides["security.metrics_require_key"] = args.metrics_require_key
    return overrides


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
