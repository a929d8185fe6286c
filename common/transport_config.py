"""The ``transport`` section of the cluster config: which backend moves KV between workers (issue #16)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["auto", "tcp", "shm"]


class TransportConfig(BaseModel):
    """``transport: {backend: shm}`` in the config file (a bare ``transport: shm`` is read the same way)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = Field(
        "auto",
        description=(
            "tcp: bytes over sockets. shm: through shared-memory segments between processes of one host (peers "
            "on other hosts get them over TCP). auto: tcp for now; shm once it outpaces tcp on one host "
            "(benchmarks/results/transport_throughput.md)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_backend(cls, data: Any) -> Any:
        return {"backend": data} if isinstance(data, str) else data

    @property
    def endpoint_kind(self) -> str:
        """The registry name of the endpoint a worker opens. ``auto`` is tcp until the shared-memory path beats
        it: a segment made per transfer costs its page allocation on both sides, which on this machine makes
        shm slower than loopback TCP (benchmarks/results/transport_throughput.md)."""
        return "tcp" if self.backend == "auto" else self.backend
