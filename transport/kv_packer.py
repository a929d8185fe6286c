"""Packing KV out of an engine's blocks and unpacking it into them, off the engine step.

    engine thread (in the step that computes the KV)        packer thread
    submit(SaveSpec) ─────────── queue ──────────────────▶  kv_codec.pack(blocks) → transport.publish(key)
    finished_sending(ids vLLM has finished) ◀─ done ─────── (or transport.fail(key) if the pack failed)

    engine thread (a step that finds a load's KV landed)
    submit_load(spec, buffers) ─ same queue ─────────────▶  kv_codec.unpack_into(blocks)
    unpacked() (in get_finished) ◀──────── Unpacked ─────── tokens restored, or why not

The step that computes the last of a parked request's tokens only queues its
pack; a thread copies the blocks out and parks them in the endpoint. vLLM
keeps the blocks until then: the connector's ``request_finished`` asks it to
(``delay_free_blocks``) for every request with a pack submitted, and
``finished_sending`` names each such request once all of its packs are done and
vLLM has finished it (``get_finished``'s argument), which frees its blocks in the
next step. The blocks a pack reads are full or belong to a request that no
longer runs, so the next steps never write them while the packer reads.

On a CUDA cache the submit records an event on the engine's stream and the
packer's own stream waits for it, so the copy starts once the forward pass that
wrote the KV has, and never waits for the steps after it. A pack that fails marks
its key failed in the endpoint (``transport.fail``): whoever waits for the parked
KV learns it at once instead of at the transfer deadline.

A load runs the other way on the same thread: the connector hands over the
buffers that landed for a request waiting in vLLM's WAITING_FOR_REMOTE_KVS, the
thread copies them into the request's blocks (which no step reads or writes
until vLLM hears the load is over), and the next ``unpacked()`` reports it, so
vLLM schedules the request only once its KV is in. On a CUDA cache the copy runs
on the packer's stream, which it waits for before reporting.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from tetriserve.transport import kv_codec
from tetriserve.transport.api import Received, Transport

logger = logging.getLogger(__name__)

# torch.cuda's Stream and Event constructors carry no annotations; these say what they take and make
_new_stream: Callable[[torch.device], torch.cuda.Stream] = torch.cuda.Stream
_new_event: Callable[[], torch.cuda.Event] = torch.cuda.Event


@dataclass(frozen=True)
class SaveSpec:
    req_id: str
    key: str
    block_ids: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True)
class Unpacked:
    """A load the packer thread is done with: ``tokens`` restored into ``spec``'s blocks, or ``error``."""

    spec: SaveSpec  # the connector's LoadSpec
    since: float  # monotonic: when the load was asked for (its trace span starts there)
    tokens: int = 0
    nbytes: int = 0  # KV bytes copied in (headers not counted)
    error: str | None = None


@dataclass(frozen=True)
class _Pack:
    spec: SaveSpec
    ready: torch.cuda.Event | None  # a CUDA event the copy waits for (None on CPU)


@dataclass(frozen=True)
class _Unpack:
    spec: SaveSpec
    buffers: Sequence[Received]
    since: float


class KVPacker:
    def __init__(
        self,
        layers: Mapping[str, torch.Tensor],
        dim: int,
        block_size: int,
        transport: Transport,
        on_packed: Callable[[str, int], None] = lambda key, nbytes: None,
    ) -> None:
        """``layers``/``dim``: the engine's KV caches and their block dimension; ``on_packed(key, nbytes)``:
        called on the packer thread after each pack is parked."""
        self._layers, self._dim, self._block_size = layers, dim, block_size
        self._transport = transport
        self._on_packed = on_packed
        self._queue: queue.Queue[_Pack | _Unpack | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified whenever a pack is done
        self._pending: Counter[str] = Counter()  # request id -> packs submitted and not done
        self._finished: set[str] = set()  # requests vLLM has finished whose blocks wait for packs
        self._unpacking: set[str] = set()  # requests whose load is queued or running
        self._unpacked: list[Unpacked] = []  # loads done since the last ``unpacked()``
        cuda = next(iter(layers.values())).device.type == "cuda" if layers else False
        self._stream = _new_stream(next(iter(layers.values())).device) if cuda else None
        self._thread = threading.Thread(target=self._run, name="kv-packer", daemon=True)
        self._thread.start()

    def submit(self, spec: SaveSpec) -> None:
        """Engine thread, inside the step that computed ``spec``'s KV: queue its pack."""
        ready = None
        if self._stream is not None:
            ready = _new_event()
            ready.record()  # on the engine's current stream, after this step's forward pass
        with self._lock:
            self._pending[spec.req_id] += 1
        self._queue.put(_Pack(spec, ready))

    def submit_load(self, spec: SaveSpec, buffers: Sequence[Received], since: float) -> None:
        """Engine thread: copy ``buffers`` (landed KV) into ``spec``'s blocks on the packer thread. The blocks
        must stay untouched by the steps until ``unpacked()`` has named the load."""
        with self._lock:
            self._unpacking.add(spec.req_id)
        self._queue.put(_Unpack(spec, buffers, since))

    def unpacked(self) -> list[Unpacked]:
        """Engine thread: the loads finished since the last call."""
        with self._lock:
            done, self._unpacked = self._unpacked, []
        return done

    def unpacking(self, req_id: str | None = None) -> int:
        """Loads queued or running (of ``req_id`` only, if given)."""
        with self._lock:
            return int(req_id in self._unpacking) if req_id is not None else len(self._unpacking)

    def finished_sending(self, finished_req_ids: set[str]) -> set[str] | None:
        """Engine thread (``get_finished``): of the requests with packs submitted, those whose packs are all done
        and which vLLM has finished (now, in ``finished_req_ids``, or earlier): vLLM may free their blocks."""
        with self._lock:
            self._finished.update(r for r in finished_req_ids if r in self._pending)  # submitted, not reported
            done = {r for r in self._finished if self._pending[r] <= 0}
            for r in done:
                self._finished.discard(r)
                del self._pending[r]
        return done or None

    def wait_for(self, req_ids: Sequence[str], timeout_s: float = 30.0) -> None:
        """Engine thread: block until no pack of ``req_ids`` is queued or running (their blocks are about to be
        reused: a preemption)."""
        with self._idle:
            self._idle.wait_for(lambda: all(self._pending.get(r, 0) <= 0 for r in req_ids), timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish the packs queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, _Unpack):
                self._unpack(item)
                del item  # its buffers (perhaps views of a peer's slab) go now, not when the next item comes
                continue
            spec = item.spec
            try:
                nbytes = self._pack(spec, item.ready)
            except Exception as exc:
                logger.exception("kv pack of %s failed", spec.key)
                self._transport.fail(spec.key, f"packing its KV failed: {type(exc).__name__}: {exc}")
            else:
                self._on_packed(spec.key, nbytes)
            finally:
                with self._lock:
                    self._pending[spec.req_id] -= 1
                    self._idle.notify_all()

    def _pack(self, spec: SaveSpec, ready: torch.cuda.Event | None) -> int:
        if self._stream is None:  # straight into memory the endpoint publishes without a copy (an shm slab)
            reserve = self._transport.reserve
            packed = kv_codec.pack(self._layers, self._dim, spec.block_ids, spec.num_tokens, self._block_size,
                                   reserve=reserve)  # fmt: skip
        else:
            assert ready is not None  # recorded by ``submit`` whenever there is a stream
            with torch.cuda.stream(self._stream):
                self._stream.wait_event(ready)
                packed = kv_codec.pack(self._layers, self._dim, spec.block_ids, spec.num_tokens, self._block_size)
        self._transport.publish(spec.key, packed.buffers)  # where a decode worker on this host may pull it
        return packed.nbytes

    def _unpack(self, item: _Unpack) -> None:
        spec = item.spec
        try:
            if self._stream is None:
                tokens = kv_codec.unpack_into(self._layers, self._dim, spec.block_ids, item.buffers)
            else:
                with torch.cuda.stream(self._stream):
                    tokens = kv_codec.unpack_into(self._layers, self._dim, spec.block_ids, item.buffers)
                self._stream.synchronize()  # in the blocks before vLLM may schedule the request
            done = Unpacked(spec, item.since, tokens, kv_codec.payload_bytes(item.buffers))
        except Exception as exc:
            if not isinstance(exc, ValueError):  # a ValueError is a refused payload, the connector says why
                logger.exception("kv unpack of %s failed", spec.key)
            done = Unpacked(spec, item.since, error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._unpacking.discard(spec.req_id)
            self._unpacked.append(done)
