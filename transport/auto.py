"""The default ``auto`` backend across hosts: shared memory to a peer on this host, UCX to one on another.

    transport: {backend: auto}        # the default

A worker whose Ray cluster runs on one host opens a plain ``shm`` endpoint
(``transport/shm.py``): every peer shares its memory. Where the cluster spans
hosts (a KubeRay cluster: one pod per Ray node) it opens this endpoint, an
``shm`` endpoint with a UCX listener beside it. Its address is the shm one with
the UCX port added, ``shm://<host id>@host:port?ucx=<port>``::

    send to a peer with the same host id        shared-memory slabs (the shm path)
    send to a peer on another host, UCX open    UCX (RDMA where the NIC has it, else tcp)
    send to a peer without a UCX listener       TCP, as shm sends to another host

Both listeners land what they receive in the one ``ReceiveStore``, so the KV
connector's ``recv`` does not care which way the bytes came. Only a cluster
that spans hosts pays for UCX (its progress thread takes CPU even while no KV
moves); a plain ``shm`` sender reaches this endpoint through its
shm part, so workers that started before the cluster grew still talk to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from tetriserve.transport.api import Buffer, TransferHandle, TransportStats
from tetriserve.transport.shm import ShmTransport, split_address
from tetriserve.transport.tcp import parse_address

UCX_PARAM = "?ucx="


def ucx_port(address: str) -> int | None:
    """The UCX port an ``auto`` endpoint's address names, if any."""
    _, sep, port = address.partition(UCX_PARAM)
    return int(port) if sep else None


class AutoTransport(ShmTransport):
    def __init__(
        self, listen: str = "127.0.0.1:0", ttl_s: float = 300.0, send_threads: int = 4, pool_bytes: int = 1 << 30,
        host: str | None = None, pull: bool = True,
    ) -> None:  # fmt: skip
        """``host``: this endpoint's host id (tests give two endpoints different ones to cross "hosts")."""
        super().__init__(listen, ttl_s, send_threads, pool_bytes, host, pull)
        from tetriserve.transport.ucx import UcxTransport, split_ucx_address  # imports ucxx here only

        self._ucx = UcxTransport(f"{parse_address(listen)[0]}:0", ttl_s, store=self.store)
        self._ucx_port = split_ucx_address(self._ucx.address)[1]

    @property
    def address(self) -> str:
        return f"{super().address}{UCX_PARAM}{self._ucx_port}"

    def route(self, dst: str) -> str:
        """Which way a send to ``dst`` goes: ``shm`` (this host), ``ucx`` (another host listening on UCX), ``tcp``."""
        if split_address(dst)[0] == self._host_id:
            return "shm"
        return "ucx" if ucx_port(dst) is not None else "tcp"

    def send(self, dst: str, key: str, buffers: Sequence[Buffer], deadline_s: float) -> TransferHandle:
        if self.route(dst) == "ucx":
            host = parse_address(split_address(dst)[1])[0]
            return self._ucx.send(f"ucx://{host}:{ucx_port(dst)}", key, buffers, deadline_s)
        return super().send(dst, key, buffers, deadline_s)

    def stats(self) -> TransportStats:
        """Both parts' sends; what landed once (they share the store)."""
        shm, ucx = super().stats(), self._ucx.stats()
        sent = ("bytes_sent", "transfers_sent", "transfers_failed", "seconds_sending")
        return TransportStats(**{
            f.name: getattr(shm, f.name) + (getattr(ucx, f.name) if f.name in sent else 0) for f in fields(shm)
        })  # fmt: skip

    def close(self) -> None:
        self._ucx.close()
        super().close()
