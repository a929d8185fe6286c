"""How the SDK authenticates: the API key it sends and the TLS it verifies the server with.

    api_key=None ─▶ $TETRISERVE_API_KEY (its first key, if a comma list) ─▶ none: no key is sent
    api_key=""   ─▶ no key, whatever the environment says
    a key        ─▶ every call carries metadata ``authorization: Bearer <key>``

    tls=False, root_certificates=None ─▶ plaintext channel
    tls=True                          ─▶ TLS, the server verified against the system's root certificates
    root_certificates=PEM | path      ─▶ TLS, verified against that CA (or the server's own self-signed cert)
    credentials=grpc.ChannelCredentials ─▶ used as given (mTLS, custom setups)

The key travels as call metadata, not call credentials, so it also works on a plaintext channel (a
loopback port, or TLS ended by a proxy in front of the service); over a network, use TLS.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

API_KEY_ENV = "TETRISERVE_API_KEY"
AUTHORIZATION_METADATA_KEY = "authorization"

Metadata = tuple[tuple[str, str], ...]


def resolve_api_key(api_key: str | None) -> str | None:
    """``api_key``, or (when None) the first key of ``$TETRISERVE_API_KEY``; None when there is none."""
    if api_key is None:
        api_key = next((k.strip() for k in os.environ.get(API_KEY_ENV, "").split(",") if k.strip()), "")
    return api_key or None


def auth_metadata(api_key: str | None) -> Metadata | None:
    """The metadata every call carries for ``api_key`` (None: nothing)."""
    if api_key is None:
        return None
    if any(c.isspace() for c in api_key):
        raise ValueError("api_key: must not contain whitespace")
    return ((AUTHORIZATION_METADATA_KEY, f"Bearer {api_key}"),)


def read_pem(pem: bytes | str | os.PathLike[str]) -> bytes:
    """PEM bytes from bytes, PEM text, or a path to a PEM file."""
    if isinstance(pem, bytes):
        return pem
    if isinstance(pem, str) and pem.lstrip().startswith("-----BEGIN"):
        return pem.encode()
    path = Path(pem).expanduser()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"root_certificates: cannot read {path}: {exc}") from exc


def channel_credentials(
    credentials: grpc.ChannelCredentials | None,
    tls: bool,
    root_certificates: bytes | str | os.PathLike[str] | None,
) -> grpc.ChannelCredentials | None:
    """The channel credentials the arguments ask for; None means a plaintext channel."""
    if credentials is not None:
        if tls or root_certificates is not None:
            raise ValueError("credentials: give either credentials or tls/root_certificates, not both")
        return credentials
    if not tls and root_certificates is None:
        return None
    roots = None if root_certificates is None else read_pem(root_certificates)
    return grpc.ssl_channel_credentials(root_certificates=roots)
