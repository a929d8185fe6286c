"""Pack a request's KV blocks into transport buffers and unpack them into another engine's blocks.

Engine-agnostic: works on a ``{layer_name: tensor}`` map whose block
dimension is located once (``block_dim``). Every attention layout vLLM uses
keeps all of a block's K and V inside that block's slice (on CPU the layout is
``[num_blocks, kv_heads, block_size, 2*head_dim]``), so copying whole blocks of
every layer moves the complete KV state of the first ``num_tokens`` tokens.

Buffers: ``[header_json, layer_0, ..., layer_{L-1}]``; each layer buffer holds
``n_blocks`` consecutive block slices in the order of the request's block table.

From a GPU cache, ``pack`` copies into pinned host memory (torch's caching host
allocator, so steady state allocates nothing), every layer's copy queued before one
wait: on an H100, 256 MiB (2048 tokens of a Llama-3-8B shape) packed in 6.0 ms,
against 126 ms (2.1 GB/s) into pageable memory, inside the engine step
(``python benchmarks/gpu_transport.py --sizes-mib 1 4 16 64 256 --repeats 10``,
``benchmarks/results/gpu_transport.md``). Pinned pages also let a
backend that stages through the GPU (``nccl``) copy them by DMA.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import torch

from tetriserve.transport.api import Buffer, Received

B = TypeVar("B", bound=Buffer)


class KVHeader(TypedDict):
    """A packed part's first buffer, as JSON: what its layer buffers hold."""

    num_tokens: int
    block_size: int
    layers: list[str]
    shape: list[int]
    dtype: str
    dim: int


_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.uint8)}


def block_dim(tensor: torch.Tensor, num_blocks: int) -> int:
    """The dimension of a KV layer tensor that indexes blocks (0 or 1)."""
    for dim in (0, 1):
        if tensor.dim() > dim and tensor.shape[dim] == num_blocks:
            return dim
    raise ValueError(f"cannot find a block dimension of size {num_blocks} in KV tensor of shape {tuple(tensor.shape)}")


def blocks_for(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size)


@dataclass(frozen=True)
class PackedKV:
    buffers: list[Received]  # memoryviews, or what the ``reserve`` given to ``pack`` returned, as it returned it
    nbytes: int
    num_blocks: int
    pinned: bool = False  # the layer buffers are page-locked host memory (packed from a GPU cache)


def pack(
    layers: Mapping[str, torch.Tensor],
    dim: int,
    block_ids: Sequence[int],
    num_tokens: int,
    block_size: int,
    pinned: bool | None = None,
    reserve: Callable[[list[int]], Sequence[Received]] | None = None,
) -> PackedKV:
    """Copy the first ``num_tokens`` tokens' blocks of every layer to host memory: page-locked from a CUDA cache
    unless ``pinned`` is False (the benchmark's pageable comparison). From a CPU cache with ``reserve`` (an endpoint's:
    writable buffers of the sizes asked, in memory it can publish without copying, ``Transport.reserve``) the
    blocks are gathered straight into those buffers, which are returned; the header is padded with JSON
    whitespace to a multiple of 64 bytes, so every layer's bytes start aligned."""
    n = blocks_for(num_tokens, block_size)
    if len(block_ids) < n:
        raise ValueError(f"pack: {num_tokens} tokens need {n} blocks, request holds {len(block_ids)}")
    names = list(layers)
    first = layers[names[0]]
    shape = list(first.shape)
    shape[dim] = n
    header: KVHeader = {
        "num_tokens": num_tokens,
        "block_size": block_size,
        "layers": names,
        "shape": shape,
        "dtype": str(first.dtype),
        "dim": dim,
    }
    head = json.dumps(header).encode()
    idx = torch.tensor(list(block_ids[:n]), dtype=torch.long, device=first.device)
    if reserve is not None and first.device.type == "cpu":
        return _pack_into(layers, dim, idx, shape, head, reserve)
    pin = first.device.type == "cuda" and pinned is not False
    bufs: list[memoryview] = []
    for name in names:
        part = layers[name].index_select(dim, idx)
        if first.device.type != "cpu":
            host = torch.empty(part.shape, dtype=part.dtype, pin_memory=pin)
            part = host.copy_(part, non_blocking=pin)  # pinned: queued; waited for once, below
        bufs.append(part.view(torch.uint8).numpy().data.cast("B"))
    if pin:
        torch.cuda.current_stream(first.device).synchronize()
    return PackedKV([memoryview(head), *bufs], sum(b.nbytes for b in bufs), n, pin)


def _pack_into(
    layers: Mapping[str, torch.Tensor],
    dim: int,
    idx: torch.Tensor,
    shape: list[int],
    head: bytes,
    reserve: Callable[[list[int]], Sequence[Received]],
) -> PackedKV:
    head += b" " * (-len(head) % 64)
    sizes = [math.prod(shape) * t.element_size() for t in layers.values()]
    buffers = reserve([len(head), *sizes])
    memoryview(buffers[0]).cast("B")[:] = head
    for layer, buf, size in zip(layers.values(), buffers[1:], sizes, strict=True):
        if size:
            out = torch.frombuffer(buf, dtype=torch.uint8).view(layer.dtype).view(shape)
            torch.index_select(layer, dim, idx, out=out)
    return PackedKV(buffers if isinstance(buffers, list) else list(buffers), sum(sizes), shape[dim])


def split_parts(buffers: Sequence[B]) -> list[tuple[KVHeader, Sequence[B]]]:
    """The packed parts ``buffers`` holds one after another (``transport/parts.py``): (header, layer buffers)."""
    out: list[tuple[KVHeader, Sequence[B]]] = []
    at = 0
    while at < len(buffers):
        header: KVHeader = json.loads(bytes(buffers[at]))
        n = len(header["layers"])
        layer_bufs = buffers[at + 1 : at + 1 + n]
        if len(layer_bufs) != n:
            raise ValueError(f"unpack: header names {n} layers but {len(layer_bufs)} buffers arrived")
        out.append((header, layer_bufs))
        at += 1 + n
    return out


def payload_bytes(buffers: Sequence[Received]) -> int:
    """The KV bytes in ``buffers`` (every part's layer buffers, not their headers)."""
    return sum(len(b) for _, layer_bufs in split_parts(buffers) for b in layer_bufs)


def unpack_into(
    layers: Mapping[str, torch.Tensor], dim: int, block_ids: Sequence[int], buffers: Sequence[Received]
) -> int:
    """Copy received blocks into ``block_ids``; returns the number of tokens restored. ``buffers`` may hold
    several parts (one per prefill chunk), each of whole blocks but the last, in block-table order."""
    pieces = split_parts(buffers)
    if not pieces:
        raise ValueError("unpack: nothing arrived")
    offset = tokens = 0
    for i, (header, _) in enumerate(pieces):  # validate every part before writing any
        part_tokens, block_size = int(header["num_tokens"]), int(header["block_size"])
        if i < len(pieces) - 1 and part_tokens % block_size:
            raise ValueError(f"unpack: part {i} of {len(pieces)} ends inside a block ({part_tokens} tokens)")
        _check(layers, dim, header)
        offset += blocks_for(part_tokens, block_size)
        tokens += part_tokens
    if len(block_ids) < offset:
        raise ValueError(f"unpack: {offset} blocks arrived, request holds {len(block_ids)}")
    offset = 0
    for header, layer_bufs in pieces:
        n = blocks_for(int(header["num_tokens"]), int(header["block_size"]))
        _copy_in(layers, dim, block_ids[offset : offset + n], header, layer_bufs)
        offset += n
    return tokens


def _check(layers: Mapping[str, torch.Tensor], dim: int, header: KVHeader) -> None:
    names: list[str] = header["layers"]
    if set(names) != set(layers):
        raise ValueError("unpack: sender and receiver have different attention layers (different models?)")
    dtype = _DTYPES.get(header["dtype"])
    if dtype is None:
        raise ValueError(f"unpack: unsupported KV dtype {header['dtype']!r}")
    shape = header["shape"]
    for name in names:
        dst = layers[name]
        if dst.dtype != dtype or list(dst.shape[:dim]) + list(dst.shape[dim + 1 :]) != shape[:dim] + shape[dim + 1 :]:
            raise ValueError(f"unpack: layer {name} is {dst.dtype}{tuple(dst.shape)}, sender sent {dtype}{shape}")


def _copy_in(
    layers: Mapping[str, torch.Tensor],
    dim: int,
    block_ids: Sequence[int],
    header: KVHeader,
    layer_bufs: Sequence[Received],
) -> None:
    names: list[str] = header["layers"]
    shape = header["shape"]
    idx = torch.tensor(list(block_ids), dtype=torch.long, device=layers[names[0]].device)
    for name, buf in zip(names, layer_bufs, strict=True):
        dst_bytes = layers[name].view(torch.uint8)  # byte copies work for every dtype, fp8 included
        src = torch.frombuffer(buf, dtype=torch.uint8).reshape([*shape[:-1], dst_bytes.shape[-1]])
        dst_bytes.index_copy_(dim, idx, src.to(dst_bytes.device))
