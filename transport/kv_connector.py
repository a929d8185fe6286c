"""tetriserve's vLLM KV connector: hand a request's prefilled KV to its decode engine (TetriInfer §3.3.4).

Loaded by vLLM through ``kv_connector_module_path="tetriserve.transport.kv_connector"``,
``kv_connector="TetriKVConnector"``. Per-request instructions arrive as a
``KVInstruction`` (``transport.instructions``) in vLLM's ``kv_transfer_params``:

    prefill engine  KVInstruction(PARK, k)
    decode engine   KVInstruction(RECV, k, num_tokens=L)

Lifecycle (request-level transfer, as in the paper)::

    PREFILL ENGINE                                   DECODE ENGINE
    sched: step that finishes the prompt ─meta─▶
    worker.wait_for_save: queue the pack; the packer
           thread copies the blocks of all layers out,
           transport.hold(k) in this process's endpoint
    PrefillWorker, once the dispatcher has chosen:
           recv(k), send(dst, k)  ───────────TCP───────────▶  ReceiveStore[k]
                                                     sched: get_num_new_matched_tokens = (L, async)
                                                            request waits in WAITING_FOR_REMOTE_KVS
                                                     worker.start_load_kv polls recv(k) every step;
                                                            once landed the packer thread copies the
                                                            blocks in, off the step; get_finished then
                                                            reports finished_recving
                                                     sched: request runs; only token L+1 is computed

    (on one host the decode worker pulls k from the prefill worker's slabs instead of being sent it:
    ``shm_pull.py``; either way it lands in the ReceiveStore the connector polls)

When the KV has already landed as the decode engine first schedules the request
(the usual case: the bytes travel while the prefill worker's ``take`` call on the decode worker
runs) and is at most ``sync_load_bytes`` (the config's ``transport.sync_load_mib``),
the load is synchronous instead: ``get_num_new_matched_tokens`` returns (L,
False), the worker copies the blocks in before that very step's forward pass,
and token L+1 comes out of the request's first step, not its second. A bigger
load goes to the packer thread even when landed, so that no step of the other
requests waits for its copy.

A prompt's KV is parked in parts (``parts.py``), one per step of its chunked
prefill: each covers the blocks that step filled, the last one the rest, so the
first parts can travel while the later chunks compute (the prefill worker's
pipelined handoff); a receiver sees the key whole once every part has landed.
The copy out of the prefill engine's blocks happens off the step, on the
packer thread (``kv_packer.py``): ``request_finished`` keeps a parked request's
blocks until its pack is done, and ``get_finished`` then frees them
(``finished_sending``). Parking lets the length predictor run in parallel
with prefill and the dispatcher choose afterwards. A load that misses its
deadline, breaks off (the transport marks the key failed: the sender died, or
told the decode worker its send failed) or fails validation reports its
blocks as load errors at once; vLLM then recomputes the prompt there
(``kv_load_failure_policy="recompute"``, our default) or finishes the
request with an error (``"fail"``), which the front door takes as a reason to
migrate the request.

Swap (CacheOpt §3.5) reuses both halves inside one decode engine: when the
decode scheduler preempts a request by swapping, ``swap_out`` (scheduler side,
before the blocks are freed) queues a save of its blocks and turns its
instruction into ``KVInstruction(RECV, "swap:<id>:<n>", n)``; the worker packs
the blocks into this endpoint's own landing area in ``handle_preemptions``, before
the model runner zeroes or overwrites blocks handed to others, and when vLLM resumes
the request it loads the KV back through the ordinary ``recv`` path instead of
recomputing it.

A slice move (SCLS §7) parks a *decoding* request like a prompt: ``park_running``
saves the KV of all its tokens in the step that computes the last of them (the
step that ends its slice); the decode worker then sends it to another decode
worker's endpoint, which loads it through ``recv`` as it would a prefill's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from tetriserve.transport import endpoints, kv_codec, parts
from tetriserve.transport.instructions import KVInstruction, KVMode, instruction_of
from tetriserve.transport.kv_counters import bump as _bump
from tetriserve.transport.kv_loads import KVLoads, LoadSpec
from tetriserve.transport.kv_packer import KVPacker, SaveSpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

SYNC_LOAD_BYTES = 4 << 20  # landed KV up to this size is copied in within the step (transport.sync_load_mib)


@dataclass
class TetriKVMetadata(KVConnectorMetadata):
    saves: list[SaveSpec] = field(default_factory=list)
    swaps: list[SaveSpec] = field(default_factory=list)  # swap-outs: packed before the step touches any block
    loads: list[LoadSpec] = field(default_factory=list)
    cancelled: list[tuple[str, str]] = field(default_factory=list)  # (req_id, key)
    preempted: list[str] = field(default_factory=list)  # requests whose blocks this step frees (and may reuse)


@dataclass
class _Producer:
    key: str
    num_tokens: int  # done once the KV of this many tokens is computed
    block_ids: list[int]
    saved_blocks: int = 0  # blocks parked in earlier parts (``transport/parts.py``)
    part: int = 0  # the index of its next part


def _instruction(request: Request) -> KVInstruction | None:
    return instruction_of(request.kv_transfer_params)


class TetriKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._block_size = vllm_config.cache_config.block_size
        self._deadline_s = float(extra.get("deadline_s", 30.0))
        self._endpoint = str(extra.get("endpoint", "default"))
        self._sync_load_bytes = int(extra.get("sync_load_bytes", SYNC_LOAD_BYTES))
        # scheduler side
        self._landed: set[str] = set()  # requests whose load get_num_new_matched_tokens said is synchronous
        self._producers: dict[str, _Producer] = {}
        self._load_requested: set[str] = set()
        self._pending_loads: list[LoadSpec] = []
        self._pending_swaps: list[SaveSpec] = []
        self._swapped: dict[str, str] = {}  # req_id -> key of its KV swapped out and not yet back
        self._saving: set[str] = set()  # requests with a save issued: their blocks wait for the packer
        self._cancelled: list[tuple[str, str]] = []
        # worker side
        self._layers: dict[str, torch.Tensor] = {}
        self._dim = 0
        self._packer: KVPacker | None = None
        self._loads: KVLoads | None = None
        self._transport = None
        if role == KVConnectorRole.WORKER:
            self._transport = endpoints.get_or_create(
                self._endpoint, str(extra.get("backend", "tcp")), str(extra.get("listen", "127.0.0.1:0"))
            )

    # ============================== scheduler side ==============================
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        kv = _instruction(request)
        if kv is None or kv.mode is not KVMode.RECV or request.request_id in self._load_requested:
            return 0, False
        remaining = kv.num_tokens - num_computed_tokens
        if remaining <= 0:
            return 0, False
        # the worker half shares this process's endpoint (in-process engine): a small load whose bytes are all
        # here can be synchronous, as long as one token is left for the step to compute
        endpoint = endpoints.get(self._endpoint)
        size = endpoint.landed_bytes(kv.key) if endpoint is not None else None
        if kv.num_tokens < request.num_tokens and size is not None and size <= self._sync_load_bytes:
            self._landed.add(request.request_id)
            return remaining, False
        self._landed.discard(request.request_id)
        return remaining, True

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        kv = _instruction(request)
        if kv is None or num_external_tokens <= 0 or kv.mode is not KVMode.RECV:
            return
        self._load_requested.add(request.request_id)
        block_ids = tuple(blocks.get_block_ids()[0])
        landed = request.request_id in self._landed
        self._landed.discard(request.request_id)
        self._pending_loads.append(LoadSpec(request.request_id, kv.key, block_ids, kv.num_tokens, landed))

    def swap_out(self, request: Request, block_ids: list[int], num_tokens: int) -> str:
        """Queue ``request``'s first ``num_tokens`` of KV (in ``block_ids``) to leave the block pool this step;
        call before the blocks are freed. On resume vLLM loads it back through the ``recv`` path."""
        key = f"swap:{request.request_id}:{request.num_preemptions}"
        used = tuple(block_ids[: kv_codec.blocks_for(num_tokens, self._block_size)])
        self._pending_swaps.append(SaveSpec(request.request_id, key, used, num_tokens))
        self._swapped[request.request_id] = key
        self._load_requested.discard(request.request_id)
        request.kv_transfer_params = KVInstruction(KVMode.RECV, key, num_tokens).params()
        return key

    def park_running(self, request: Request, block_ids: list[int], key: str) -> None:
        """Park a decoding request's KV under ``key`` at the end of its next step, as a prefill engine parks
        a prompt's (SCLS slice move): the step that computes its last known token saves every token's KV."""
        self._producers[request.request_id] = _Producer(key, request.num_tokens, list(block_ids))

    def in_flight(self) -> set[str]:
        """Requests whose KV is being loaded, swapped out or parked to leave right now."""
        return {s.req_id for s in self._pending_loads} | {s.req_id for s in self._pending_swaps} | set(self._producers)

    def on_new_request(self, request: Request) -> None:
        kv = _instruction(request)
        if kv is not None and kv.mode is KVMode.PARK:
            self._producers[request.request_id] = _Producer(kv.key, len(request.prompt_token_ids or ()), [])

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = TetriKVMetadata(swaps=self._pending_swaps, loads=self._pending_loads, cancelled=self._cancelled)
        self._pending_loads, self._pending_swaps, self._cancelled = [], [], []
        progress: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._producers:
                self._producers[new.req_id].block_ids = list(new.block_ids[0])
                progress[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            prod = self._producers.get(req_id)
            if prod is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # preempted, now recomputed: its parts again, from the first
                prod.block_ids = list(new_ids[0]) if new_ids else []
                prod.saved_blocks = prod.part = 0
            elif new_ids:
                prod.block_ids.extend(new_ids[0])
            progress[req_id] = cached.num_computed_tokens[i]
        for req_id, computed in progress.items():
            spec = self._next_part(req_id, computed + scheduler_output.num_scheduled_tokens.get(req_id, 0))
            if spec is not None:
                meta.saves.append(spec)
                self._saving.add(req_id)
        meta.preempted = sorted(scheduler_output.preempted_req_ids or ())
        return meta

    def _next_part(self, req_id: str, computed: int) -> SaveSpec | None:
        """The part of ``req_id``'s KV this step completes, once ``computed`` tokens' KV is (``parts.next_part``)."""
        prod = self._producers[req_id]
        part = parts.next_part(prod.key, prod.num_tokens, prod.saved_blocks, prod.part, computed, self._block_size)
        if part is None:
            return None
        key, start, end, tokens = part
        prod.saved_blocks, prod.part = end, prod.part + 1
        if parts.is_last(key):
            del self._producers[req_id]
        return SaveSpec(req_id, key, tuple(prod.block_ids[start:end]), tokens)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, object] | None]:
        self._producers.pop(request.request_id, None)
        self._landed.discard(request.request_id)
        swapped = self._swapped.pop(request.request_id, None)
        if swapped is not None and request.request_id not in self._load_requested:  # never came back: drop it
            self._cancelled.append(("", swapped))
        if request.request_id in self._load_requested:
            self._load_requested.discard(request.request_id)
            kv = _instruction(request)
            self._cancelled.append((request.request_id, kv.key if kv is not None else ""))
        if request.request_id in self._saving:  # its blocks stay until the packer is done with them
            self._saving.discard(request.request_id)
            return True, None
        return False, None

    # ============================== worker side =================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = dict(kv_caches)
        first = next(iter(self._layers.values()))
        self._dim = kv_codec.block_dim(first, self._kv_cache_config.num_blocks)
        logger.info(
            "kv connector: %d layers, block dim %d, layer shape %s", len(self._layers), self._dim, tuple(first.shape)
        )
        assert self._transport is not None
        self._packer = KVPacker(
            self._layers,
            self._dim,
            self._block_size,
            self._transport,
            on_packed=lambda key, nbytes: _bump(bytes_packed=nbytes, requests_packed=int(parts.is_last(key))),
        )
        self._loads = KVLoads(self._transport, self._packer, self._layers, self._dim, self._deadline_s)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Swap-outs, before the step touches any block: the model runner zeroes blocks it hands out anew,
        and a victim's freed blocks may be handed to another request in this very step."""
        assert isinstance(kv_connector_metadata, TetriKVMetadata)
        assert self._transport is not None
        if self._packer is not None and kv_connector_metadata.preempted:
            self._packer.wait_for(kv_connector_metadata.preempted)  # their blocks may be written this step
        for spec in kv_connector_metadata.swaps:
            packed = kv_codec.pack(self._layers, self._dim, spec.block_ids, spec.num_tokens, self._block_size)
            self._transport.hold(spec.key, packed.buffers, expires=False)  # request_finished discards it
            _bump(swaps_out=1, bytes_swapped_out=packed.nbytes)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: object) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TetriKVMetadata)
        assert self._loads is not None
        self._loads.start(meta.loads, meta.cancelled)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: object
    ) -> None:
        return

    def wait_for_save(self) -> None:
        """Queue this step's saves for the packer thread (``kv_packer.py``): the step does not copy them."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, TetriKVMetadata)
        assert self._packer is not None
        for spec in meta.saves:
            self._packer.submit(spec)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        recving = self._loads.finished() if self._loads is not None else None
        sent = self._packer.finished_sending(finished_req_ids) if self._packer is not None else None
        return sent, recving

    def shutdown(self) -> None:
        if self._packer is not None:
            self._packer.close()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._loads.errors() if self._loads is not None else set()
