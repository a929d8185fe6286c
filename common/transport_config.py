"""The ``transport`` section of the cluster config: which backend moves KV between workers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["auto", "tcp", "shm", "ucx", "nccl", "mock"]


class LinkEmulation(BaseModel):
    """A slower link than this machine's, emulated over the real backend (``transport/emulate.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gbps: float = Field(gt=0, description="Link bandwidth, Gb/s: a transfer occupies the link n·8/gbps seconds.")
    latency_us: float = Field(0.0, ge=0, description="One-way latency added to every transfer, µs.")


class TransportConfig(BaseModel):
    """``transport: {backend: shm}`` in the config file (a bare ``transport: shm`` is read the same way)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = Field(
        "auto",
        description=(
            "tcp: bytes over sockets. shm: through reused shared-memory slabs between processes of one host "
            "(peers on other hosts get them over TCP). ucx: through ucxx (tcp and shared memory, RDMA where the "
            "cluster has it). nccl: torch.distributed point-to-point on a group per pair (NCCL on CUDA, gloo on "
            "CPU). auto: shm within a host; where the cluster spans hosts, ucx to a worker on another host (tcp "
            "to one without a UCX listener). mock: TetriInfer's "
            "transfer mock, metadata only over the emulated link (needs emulate; zero KV: timing studies only)."
        ),
    )

    emulate: LinkEmulation | None = Field(
        None, description="Shape every worker's sends to a slower link (studies of other interconnects); off: none."
    )
    pipeline: bool = Field(
        True,
        description=(
            "Pipelined handoff: when a request's length prediction is ready before its prefill ends, the decode "
            "worker is chosen then and the KV of each prefill chunk is sent to it as soon as it is computed, so "
            "at the first token only the last chunk's KV is still to travel (prefill_worker/pipeline.py). "
            "false: the whole KV is sent once the prefill is done."
        ),
    )
    pull: bool = Field(
        True,
        description=(
            "One-sided pull within a host (shm, auto): a prefill worker publishes each part of a prompt's KV in a "
            "shared-memory slab as it is computed, and the decode worker chosen for the request maps those slabs "
            "and takes the parts itself, as they come; nothing is copied between the processes "
            "(transport/shm_pull.py). A decode worker on another host, or any other backend, is sent the KV. "
            "false: always sent."
        ),
    )
    sync_load_mib: float = Field(
        4.0,
        ge=0,
        description=(
            "A decode engine copies KV that has already landed when it first schedules the request into the "
            "request's blocks inside that step when it is at most this many MiB: the request's first token then "
            "comes a step sooner. Bigger KV, and KV that lands later, is copied on the engine's packer thread, "
            "so that no step of the other requests waits for the copy. 0: always on the packer thread."
        ),
    )
    timeout_s: float = Field(30.0, gt=0, description="Deadline for one request's KV transfer.")
    lease_s: float = Field(
        300.0,
        gt=0,
        description=(
            "The lease on KV parked in a worker's endpoint: a prefill's packed KV waiting to be sent (or discarded) "
            "and KV that landed on a decode worker waiting for its load. Past it, nobody having taken it, the KV "
            "is dropped and its memory freed (counted as `expired` in the transport stats), so KV of a request "
            "whose peer died is never held for good."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_backend(cls, data: object) -> object:
        return {"backend": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _mock_needs_a_link(self) -> TransportConfig:
        if self.backend == "mock" and self.emulate is None:
            raise ValueError("transport.backend mock needs transport.emulate (the link whose time it waits)")
        return self
