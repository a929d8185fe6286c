"""The ``security`` section of the cluster config: API keys, per-key quotas, TLS, what stays open.

Where keys come from (all of them are accepted together)::

    security.api_keys        in the config file, or `serve --api-key KEY` (repeatable, or a comma list)
    security.api_keys_file   one key per line (format below), `serve --api-keys-file PATH`
    $TETRISERVE_API_KEY      one key, or a comma list (read by the server at start)

No key from any of them: the front doors are open (a warning is logged when they bind a non-loopback
address). A keys file::

    # comments and blank lines are ignored
    sk-alpha-7f3c...                              no quota of its own (security.rate_per_s applies)
    sk-team-b-91d2...   rate=5/s burst=10 name=team-b
    sk-batch-...        rate=600/m                per second, minute (/m, /min) or hour (/h)

A rate is a token bucket per key: ``rate`` requests a second on average, ``burst`` at once (default: the
rate rounded up, at least 1). Keys are secrets: the config keeps them as ``SecretStr`` (hidden in reprs and
dumps) and the server keeps only their SHA-256.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

API_KEY_ENV = "TETRISERVE_API_KEY"
_COMMENT = re.compile(r"\s#.*$")
_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class ApiKeySpec(BaseModel):
    """One API key and its optional quota (a bare string in YAML is a key without a quota)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr = Field(description="The key clients send as `Authorization: Bearer <key>`.")
    name: str | None = Field(None, description="Name of the key in logs (default: key-<n>); never the key itself.")
    rate_per_s: float | None = Field(
        None, gt=0, description="Requests a second this key may make on average (default: security.rate_per_s)."
    )
    burst: int | None = Field(
        None, ge=1, description="Requests this key may make at once (default: the rate rounded up, at least 1)."
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_key(cls, data: object) -> object:
        return {"key": data} if isinstance(data, str) else data

    @field_validator("key")
    @classmethod
    def _check_key(cls, key: SecretStr) -> SecretStr:
        value = key.get_secret_value()
        if not value or any(c.isspace() or c == "," for c in value):
            raise ValueError("an API key must be non-empty, without spaces or commas")
        return key


class SecurityConfig(BaseModel):
    """API keys, quotas and TLS of both front doors (``docs/deployment/security.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys: tuple[ApiKeySpec, ...] = Field(
        (),
        description=(
            "Keys the front doors accept (strings, or {key, name, rate_per_s, burst}); also `serve --api-key`. "
            "Together with api_keys_file and $TETRISERVE_API_KEY; none anywhere: the front doors are open."
        ),
    )
    api_keys_file: str | None = Field(
        None, description="File of keys, one a line: `KEY [rate=5/s] [burst=10] [name=NAME]`, # comments."
    )
    rate_per_s: float | None = Field(
        None, gt=0, description="Default quota: requests a second each key may make (None: unlimited)."
    )
    burst: int | None = Field(None, ge=1, description="Default burst of each key's quota (default: rate rounded up).")
    metrics_require_key: bool = Field(
        False, description="Whether GET /metrics needs a key too (/health and /ready never do)."
    )
    tls_cert: str | None = Field(None, description="PEM certificate (chain) both front doors serve TLS with.")
    tls_key: str | None = Field(None, description="PEM private key of tls_cert.")
    dashboard_host: str = Field(
        "127.0.0.1",
        description="Address the Ray dashboard of a local cluster binds to (0.0.0.0 opens it to the network).",
    )

    def updated(self, changes: Mapping[str, object]) -> SecurityConfig:
        """These settings with ``changes`` (``{"rate_per_s": 5.0}``) over them, validated as a whole; the rest
        kept (a front door joining a service overrides what it is given, no more)."""
        return SecurityConfig.model_validate({**self.model_dump(), **changes})

    @model_validator(mode="after")
    def _check_tls(self) -> SecurityConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("security.tls_cert and security.tls_key: give both or neither")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def all_keys(self, environ: dict[str, str] | None = None) -> tuple[ApiKeySpec, ...]:
        """Every configured key: the config's, the keys file's and ``$TETRISERVE_API_KEY``'s (first wins)."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            path = Path(self.api_keys_file).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"security.api_keys_file: cannot read {path}: {exc}") from exc
            keys.extend(parse_keys_file(text, str(path)))
        env = (environ if environ is not None else dict(os.environ)).get(API_KEY_ENV, "")
        keys.extend(ApiKeySpec.model_validate({"key": k.strip()}) for k in env.split(",") if k.strip())
        seen: set[str] = set()
        unique = []
        for spec in keys:
            if spec.key.get_secret_value() not in seen:
                seen.add(spec.key.get_secret_value())
                unique.append(spec)
        return tuple(unique)


def parse_rate(text: str, field: str = "rate") -> float:
    """``5``, ``5/s``, ``300/m``, ``300/min`` or ``1000/h`` as requests a second."""
    count, _, unit = text.strip().partition("/")
    try:
        value = float(count)
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a rate such as 5/s or 300/m") from None
    per = _UNITS.get(unit.strip() or "s")
    if per is None:
        raise ValueError(f"{field}: unknown unit {unit!r} in {text!r} (s, m, min or h)")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field}: {text!r} must be a positive rate")
    return value / per


def parse_keys_file(text: str, source: str = "api_keys_file") -> tuple[ApiKeySpec, ...]:
    """The keys of a keys file; ValueError naming ``source`` and the line for a malformed one."""
    specs: list[ApiKeySpec] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()  # a key may hold "#"; a comment starts a line or follows a space
        if not line or line.startswith("#"):
            continue
        key, *options = line.split()
        where = f"{source} line {number}"
        fields: dict[str, object] = {"key": key}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or not value:
                raise ValueError(f"{where}: expected NAME=VALUE after the key, got {option!r}")
            if name == "rate":
                fields["rate_per_s"] = parse_rate(value, f"{where}: rate")
            elif name == "burst":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{where}: burst must be a positive integer, got {value!r}")
                fields["burst"] = int(value)
            elif name == "name":
                fields["name"] = value
            else:
                raise ValueError(f"{where}: unknown option {name!r} (rate, burst or name)")
        try:
            specs.append(ApiKeySpec.model_validate(fields))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(specs)
