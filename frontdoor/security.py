"""What both front doors enforce, built once from the config's ``security`` section.

    SecurityConfig (+ keys file, + $TETRISERVE_API_KEY) ─▶ FrontDoorSecurity
        keys: KeyTable | None   None: open doors (the default; a warning on a non-loopback address)
        tls:  TlsFiles | None   uvicorn's ssl_certfile/ssl_keyfile, grpc.ssl_server_credentials
        open paths/methods      /health, /ready (and /metrics unless metrics_require_key); gRPC Health

The HTTP guard (``http_auth.ApiKeyGuard``) and the gRPC interceptor (``grpc_auth.ApiKeyInterceptor``)
both judge a request with the same ``KeyTable``, so a key's quota counts its calls on either door.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tetriserve.common.security_config import SecurityConfig
from tetriserve.frontdoor.key_table import KeyEntry, KeyTable

logger = logging.getLogger(__name__)

OPEN_HTTP_PATHS = frozenset({"/health", "/ready"})
METRICS_PATH = "/metrics"
OPEN_GRPC_METHODS = frozenset({"/tetriserve.v1.TetriServe/Health", "/grpc.health.v1.Health/Check"})


@dataclass(frozen=True)
class TlsFiles:
    """A PEM certificate (chain) and its private key, both readable and matching."""

    cert: Path
    key: Path

    @classmethod
    def of(cls, cert: str | Path, key: str | Path) -> TlsFiles:
        files = cls(Path(cert).expanduser(), Path(key).expanduser())
        for name, path in (("security.tls_cert", files.cert), ("security.tls_key", files.key)):
            if not path.is_file():
                raise ValueError(f"{name}: {path} is not a file")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"security.tls_cert/tls_key: cannot load {files.cert} with {files.key}: {exc}") from exc
        return files

    def pems(self) -> tuple[bytes, bytes]:
        """(private key, certificate chain) as PEM bytes, in grpc.ssl_server_credentials' order."""
        return self.key.read_bytes(), self.cert.read_bytes()


@dataclass(frozen=True)
class FrontDoorSecurity:
    """The keys (None: open) and TLS files (None: plain) both front doors serve with."""

    keys: KeyTable | None = None
    tls: TlsFiles | None = None
    metrics_require_key: bool = False
    open_paths: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        extra = frozenset() if self.metrics_require_key else frozenset({METRICS_PATH})
        object.__setattr__(self, "open_paths", OPEN_HTTP_PATHS | extra)

    @classmethod
    def from_config(cls, config: SecurityConfig, environ: Mapping[str, str] | None = None) -> FrontDoorSecurity:
        """Read the keys file and ``$TETRISERVE_API_KEY`` too; ValueError naming the field when one is wrong."""
        specs = config.all_keys(None if environ is None else dict(environ))
        entries = [
            KeyEntry.of(
                s.key.get_secret_value(),
                s.name or f"key-{i}",
                s.rate_per_s if s.rate_per_s is not None else config.rate_per_s,
                s.burst if s.burst is not None else config.burst,
            )
            for i, s in enumerate(specs, start=1)
        ]
        tls = TlsFiles.of(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
        return cls(KeyTable(entries) if entries else None, tls, config.metrics_require_key)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def path_is_open(self, path: str) -> bool:
        """Whether an HTTP path is served without a key (every path is when no key is configured)."""
        return self.keys is None or path in self.open_paths or path.rstrip("/") in self.open_paths

    def method_is_open(self, method: str) -> bool:
        """Whether a gRPC method (``/package.Service/Method``) is served without a key."""
        return self.keys is None or method in OPEN_GRPC_METHODS

    def describe(self) -> str:
        """One line for `serve`'s banner, e.g. "API key required (2 keys, 1 with a quota); TLS on"."""
        if self.keys is None:
            keys = "open (no API key configured)"
        else:
            n = len(self.keys)
            limited = self.keys.limited_count
            quota = f", {limited} with a quota" if limited else ""
            keys = f"API key required ({n} key{'s' if n != 1 else ''}{quota})"
        return f"{keys}; TLS {'on' if self.tls is not None else 'off'}"

    def warn_if_exposed(self, host: str) -> None:
        """Log a warning when doors bound to a non-loopback address need no key (or carry keys in clear)."""
        if is_loopback(host):
            return
        if self.keys is None:
            logger.warning(
                "the front doors on %s accept requests from anyone who reaches them: no API key is configured "
                "(serve --api-key, --api-keys-file or $TETRISERVE_API_KEY)",
                host,
            )
        elif self.tls is None:
            logger.warning("the front doors on %s take API keys without TLS: keys cross the network in clear", host)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
