"""The loading half of the KV connector's worker side: landed KV into a request's blocks (TetriInfer §3.3.4).

One ``KVLoads`` per engine, called on the engine thread only: ``start`` in
``start_load_kv`` each step, ``finished`` in ``get_finished``, ``errors`` in
``get_block_ids_with_load_errors``. A load is synchronous (``LoadSpec.landed``:
the scheduler saw its KV here and small enough, and the step's forward pass
needs it) and copied in at once; otherwise it is polled each step until its
KV lands, breaks off or misses its deadline, and a landed one is copied in on
the packer thread (``kv_packer.py``), off the step. vLLM hears that an
asynchronous load is over (``finished``) only once its copy is, and in that
same pass the blocks of a failed one as load errors, as vLLM asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tetriserve.observability import tracing
from tetriserve.transport import kv_codec
from tetriserve.transport.api import Transport
from tetriserve.transport.kv_counters import bump, set_pending_loads
from tetriserve.transport.kv_packer import KVPacker, SaveSpec, Unpacked

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadSpec(SaveSpec):
    """KV to copy into a request's blocks: a save's fields, read the other way."""

    landed: bool = False  # a synchronous load: the KV is here, copy it in before this step's forward pass


class KVLoads:
    def __init__(
        self, transport: Transport, packer: KVPacker, layers: Mapping[str, torch.Tensor], dim: int, deadline_s: float
    ) -> None:
        self._transport, self._packer = transport, packer
        self._layers, self._dim, self._deadline_s = layers, dim, deadline_s
        self._loading: dict[str, tuple[LoadSpec, float]] = {}  # waiting for their KV: (spec, deadline)
        self._finished: set[str] = set()  # asynchronous loads over, to report
        self._dropped: set[str] = set()  # cancelled while on the packer thread: only their end is reported
        self._error_blocks: set[int] = set()

    def start(self, loads: list[LoadSpec], cancelled: list[tuple[str, str]]) -> None:
        """This step's new loads and cancellations; then every pending load that can go, goes."""
        for spec in loads:
            self._loading[spec.req_id] = (spec, time.monotonic() + self._deadline_s)
        for req_id, key in cancelled:
            loading = self._loading.pop(req_id, None)
            if loading is not None and not loading[0].landed:
                # vLLM holds an aborted request's blocks while its load is pending: report the load over
                # so they free now, not never (the bytes, should they still land, are dropped on landing)
                self._finished.add(req_id)
            elif req_id and self._packer.unpacking(req_id):
                self._dropped.add(req_id)  # its copy ends first: the blocks free when that is reported
            if loading is not None or key:
                self._transport.discard(key)
        now = time.monotonic()
        for req_id, (spec, deadline) in list(self._loading.items()):
            buffers = self._transport.recv(spec.key)
            broke = self._transport.failed(spec.key) if buffers is None else None
            if buffers is None and now < deadline and not spec.landed and broke is None:
                continue
            del self._loading[req_id]
            since = deadline - self._deadline_s
            if buffers is None:
                why = broke or ("gone" if spec.landed else "missed its deadline")
                self._transport.discard(spec.key)  # a late arrival is dropped on landing
                self._over(Unpacked(spec, since, error=why))
            elif not spec.landed:
                self._packer.submit_load(spec, buffers, since)  # reported by ``finished`` once copied
            else:
                try:
                    tokens = kv_codec.unpack_into(self._layers, self._dim, spec.block_ids, buffers)
                except ValueError as exc:
                    self._over(Unpacked(spec, since, error=f"rejected: {exc}"))
                else:
                    self._over(Unpacked(spec, since, tokens, kv_codec.payload_bytes(buffers)))
        self._gauge()

    def finished(self) -> set[str] | None:
        """The asynchronous loads over since the last call (their copies done, or failed)."""
        unpacked = self._packer.unpacked()
        for done in unpacked:
            if done.spec.req_id in self._dropped:
                self._dropped.discard(done.spec.req_id)
                self._finished.add(done.spec.req_id)
            else:
                self._over(done)
        if unpacked:
            self._gauge()
        finished, self._finished = self._finished, set()
        return finished or None

    def errors(self) -> set[int]:
        """Blocks of loads that failed since the last call: vLLM recomputes or fails their requests."""
        errors, self._error_blocks = self._error_blocks, set()
        return errors

    def _over(self, done: Unpacked) -> None:
        spec = done.spec
        assert isinstance(spec, LoadSpec)
        if not spec.landed:  # vLLM hears of synchronous loads through load errors only
            self._finished.add(spec.req_id)
        if done.error is not None:
            logger.error("kv load for %s: %s", spec.req_id, done.error)
            self._error_blocks.update(spec.block_ids)
            bump(load_failures=1)
        else:
            off_step = int(not spec.landed)
            bump(
                bytes_loaded=done.nbytes,
                requests_loaded=1,
                tokens_loaded=done.tokens,
                requests_loaded_off_step=off_step,
            )
        _trace_load(spec, done, self._transport)

    def _gauge(self) -> None:
        set_pending_loads(len(self._loading) + self._packer.unpacking())


def _trace_load(spec: LoadSpec, done: Unpacked, transport: Transport) -> None:
    """The ``tetriserve.kv.load`` span of a load (engine thread): from the step that asked for it until its
    blocks are in, under the decode worker's span of its request (``tracing.link_key``)."""
    parent = tracing.key_parent(spec.key)
    if parent is None:  # tracing off, a swap-in, or a request nobody traces
        return
    from tetriserve.transport.registry import backend_of

    attributes: dict[str, str | int | bool] = {
        "tetriserve.kv.key": spec.key,
        "tetriserve.kv.bytes": done.nbytes,
        "tetriserve.kv.tokens": done.tokens,
        "tetriserve.kv.backend": backend_of(transport.address),
        "tetriserve.kv.synchronous": spec.landed,
    }
    started = tracing.now_ns() - int((time.monotonic() - done.since) * 1e9)
    tracing.record("tetriserve.kv.load", parent, started, attributes, done.error)
