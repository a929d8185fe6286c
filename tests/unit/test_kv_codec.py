"""Tests for transport.kv_codec: packing a request's KV blocks and unpacking them into other block ids.

Two layouts stand in for vLLM's KV caches (small tensors, CPU only)::

    CPU  [num_blocks, kv_heads, block_size, 2*head_dim]   block dim 0
    GPU  [2, num_blocks, block_size, kv_heads, head_dim]  block dim 1 (K/V first)
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from tetriserve.transport.api import TransferState
from tetriserve.transport.kv_codec import block_dim, blocks_for, pack, unpack_into
from tetriserve.transport.tcp import TcpTransport

HEADS, BLOCK, HEAD_DIM = 2, 4, 3
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn", "model.layers.2.self_attn.attn")
SRC_IDS, DST_IDS = [5, 2, 9], [1, 7, 3]
NUM_TOKENS = 2 * BLOCK + 1  # spans a partial third block

Layers = dict[str, torch.Tensor]


def cpu_layout(num_blocks: int, dtype: torch.dtype, heads: int = HEADS, fill: str = "random", seed: int = 0) -> Layers:
    return _layers((num_blocks, heads, BLOCK, 2 * HEAD_DIM), dtype, fill, seed)


def gpu_layout(num_blocks: int, dtype: torch.dtype, heads: int = HEADS, fill: str = "random", seed: int = 0) -> Layers:
    return _layers((2, num_blocks, BLOCK, heads, HEAD_DIM), dtype, fill, seed)


def _layers(shape: tuple[int, ...], dtype: torch.dtype, fill: str, seed: int) -> Layers:
    gen = torch.Generator().manual_seed(seed)
    out: Layers = {}
    for name in LAYERS:
        if fill == "zeros":
            out[name] = torch.zeros(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen) + 3.0).to(dtype)  # never zero: untouched blocks stay 0
    return out


LAYOUTS: list[tuple[str, Callable[..., Layers], int]] = [("cpu", cpu_layout, 0), ("gpu", gpu_layout, 1)]


def _wire(buffers: list[memoryview]) -> list[bytearray]:
    """What a two-sided transport hands the receiver: fresh bytearrays."""
    return [bytearray(b) for b in buffers]


def _assert_blocks_moved(src: Layers, dst: Layers, dim: int, src_ids: list[int], dst_ids: list[int]) -> None:
    for name in LAYERS:
        for s, d in zip(src_ids, dst_ids, strict=True):
            assert torch.equal(dst[name].select(dim, d), src[name].select(dim, s)), (name, s, d)
        for other in range(dst[name].shape[dim]):
            if other not in dst_ids:
                assert not dst[name].select(dim, other).any(), (name, other)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("layout", "make", "expected_dim"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_pack_unpack_moves_blocks_to_other_ids(
    layout: str, make: Callable[..., Layers], expected_dim: int, dtype: torch.dtype
) -> None:
    src = make(12, dtype)
    dst = make(20, dtype, fill="zeros")  # receiver has a different pool size
    dim = block_dim(next(iter(src.values())), 12)
    assert dim == expected_dim
    assert block_dim(next(iter(dst.values())), 20) == expected_dim

    packed = pack(src, dim, SRC_IDS, NUM_TOKENS, BLOCK)
    assert packed.num_blocks == 3
    per_block = src[LAYERS[0]].select(dim, 0).numel() * src[LAYERS[0]].element_size()
    assert packed.nbytes == 3 * per_block * len(LAYERS)
    assert len(packed.buffers) == 1 + len(LAYERS)
    header = json.loads(bytes(packed.buffers[0]))
    assert header["layers"] == list(LAYERS) and header["num_tokens"] == NUM_TOKENS and header["dim"] == dim

    assert unpack_into(dst, dim, DST_IDS, _wire(packed.buffers)) == NUM_TOKENS
    _assert_blocks_moved(src, dst, dim, SRC_IDS, DST_IDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=["f32", "bf16", "fp8"])
@pytest.mark.parametrize(("layout", "make", "expected_dim"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_pack_gathers_straight_into_reserved_buffers(
    layout: str, make: Callable[..., Layers], expected_dim: int, dtype: torch.dtype
) -> None:
    src = {name: t.to(dtype) for name, t in make(12, torch.float32).items()}
    dst = make(20, dtype, fill="zeros")
    asked: list[list[int]] = []

    class Reserved(list):  # type: ignore[type-arg]
        pass

    def reserve(sizes: list[int]) -> Reserved:
        asked.append(sizes)
        return Reserved(memoryview(bytearray(n)) for n in sizes)

    packed = pack(src, expected_dim, SRC_IDS, NUM_TOKENS, BLOCK, reserve=reserve)
    assert isinstance(packed.buffers, Reserved)  # the endpoint's own buffers, as it gave them: filled in place
    (sizes,) = asked
    assert sizes[0] % 64 == 0 and sizes[1:] == [len(b) for b in packed.buffers[1:]]  # layers start aligned
    assert packed.nbytes == sum(sizes[1:]) == len(pack(src, expected_dim, SRC_IDS, NUM_TOKENS, BLOCK).buffers[1]) * 3
    assert unpack_into(dst, expected_dim, DST_IDS, _wire(packed.buffers)) == NUM_TOKENS
    _assert_blocks_moved(src, dst, expected_dim, SRC_IDS, DST_IDS)


@pytest.mark.parametrize(("layout", "make", "expected_dim"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_only_the_blocks_the_tokens_need_are_moved(layout: str, make: Callable[..., Layers], expected_dim: int) -> None:
    src, dst = make(12, torch.float32), make(12, torch.float32, fill="zeros")
    packed = pack(src, expected_dim, [*SRC_IDS, 11], NUM_TOKENS, BLOCK)  # the request holds a spare block
    assert packed.num_blocks == 3
    unpack_into(dst, expected_dim, [*DST_IDS, 4], _wire(packed.buffers))
    _assert_blocks_moved(src, dst, expected_dim, SRC_IDS, DST_IDS)  # block 4 stays zero


def test_exact_block_multiple() -> None:
    src, dst = cpu_layout(8, torch.float32), cpu_layout(8, torch.float32, fill="zeros")
    packed = pack(src, 0, [3, 6], 2 * BLOCK, BLOCK)
    assert packed.num_blocks == 2
    assert unpack_into(dst, 0, [0, 1], _wire(packed.buffers)) == 2 * BLOCK
    _assert_blocks_moved(src, dst, 0, [3, 6], [0, 1])


@pytest.mark.parametrize(("tokens", "blocks"), [(1, 1), (BLOCK, 1), (BLOCK + 1, 2), (10 * BLOCK, 10)])
def test_blocks_for(tokens: int, blocks: int) -> None:
    assert blocks_for(tokens, BLOCK) == blocks


def test_block_dim_not_found() -> None:
    with pytest.raises(ValueError, match=r"block dimension of size 7 .*\(3, 5, 4\)"):
        block_dim(torch.zeros(3, 5, 4), 7)
    with pytest.raises(ValueError, match="size 7"):
        block_dim(torch.zeros(2, 3, 7), 7)  # only dims 0 and 1 can index blocks


def test_pack_needs_enough_block_ids() -> None:
    with pytest.raises(ValueError, match="need 3 blocks, request holds 2"):
        pack(cpu_layout(12, torch.float32), 0, [5, 2], NUM_TOKENS, BLOCK)


def test_unpack_needs_enough_block_ids() -> None:
    packed = pack(cpu_layout(12, torch.float32), 0, SRC_IDS, NUM_TOKENS, BLOCK)
    with pytest.raises(ValueError, match="3 blocks arrived, request holds 2"):
        unpack_into(cpu_layout(12, torch.float32, fill="zeros"), 0, [1, 7], _wire(packed.buffers))


def test_unpack_rejects_different_layer_names() -> None:
    packed = pack(cpu_layout(12, torch.float32), 0, SRC_IDS, NUM_TOKENS, BLOCK)
    dst = cpu_layout(12, torch.float32, fill="zeros")
    renamed = {f"other.{k}": v for k, v in dst.items()}
    with pytest.raises(ValueError, match="different attention layers"):
        unpack_into(renamed, 0, DST_IDS, _wire(packed.buffers))
    fewer = dict(list(dst.items())[:2])
    with pytest.raises(ValueError, match="different attention layers"):
        unpack_into(fewer, 0, DST_IDS, _wire(packed.buffers))


def test_unpack_rejects_missing_buffers() -> None:
    packed = pack(cpu_layout(12, torch.float32), 0, SRC_IDS, NUM_TOKENS, BLOCK)
    wire = _wire(packed.buffers)[:-1]
    with pytest.raises(ValueError, match="3 layers but 2 buffers arrived"):
        unpack_into(cpu_layout(12, torch.float32, fill="zeros"), 0, DST_IDS, wire)


def test_unpack_rejects_other_dtype() -> None:
    packed = pack(cpu_layout(12, torch.bfloat16), 0, SRC_IDS, NUM_TOKENS, BLOCK)
    dst = cpu_layout(12, torch.float32, fill="zeros")
    with pytest.raises(ValueError, match=r"layer model\.layers\.0\.self_attn\.attn is torch\.float32.*torch\.bfloat16"):
        unpack_into(dst, 0, DST_IDS, _wire(packed.buffers))
    assert not any(t.any() for t in dst.values())  # nothing written before the check failed


@pytest.mark.parametrize(("layout", "make", "expected_dim"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_unpack_rejects_other_shape(layout: str, make: Callable[..., Layers], expected_dim: int) -> None:
    packed = pack(make(12, torch.float32), expected_dim, SRC_IDS, NUM_TOKENS, BLOCK)
    dst = make(12, torch.float32, heads=HEADS + 1, fill="zeros")  # a model with more KV heads
    with pytest.raises(ValueError, match="sender sent"):
        unpack_into(dst, expected_dim, DST_IDS, _wire(packed.buffers))


def test_float8_round_trip_on_cpu() -> None:
    fp8 = torch.float8_e4m3fn
    src = {k: v.to(fp8) for k, v in cpu_layout(12, torch.float32).items()}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    packed = pack(src, 0, SRC_IDS, NUM_TOKENS, BLOCK)
    unpack_into(dst, 0, DST_IDS, _wire(packed.buffers))
    bytes_src = {k: v.view(torch.uint8) for k, v in src.items()}
    bytes_dst = {k: v.view(torch.uint8) for k, v in dst.items()}
    _assert_blocks_moved(bytes_src, bytes_dst, 0, SRC_IDS, DST_IDS)


@pytest.mark.parametrize(("layout", "make", "expected_dim"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_round_trip_through_tcp(layout: str, make: Callable[..., Layers], expected_dim: int) -> None:
    src, dst = make(12, torch.bfloat16), make(16, torch.bfloat16, fill="zeros")
    tx, rx = TcpTransport(), TcpTransport()
    try:
        packed = pack(src, expected_dim, SRC_IDS, NUM_TOKENS, BLOCK)
        handle = tx.send(rx.address, "req-1", packed.buffers, deadline_s=10.0)
        assert handle.wait(10.0) is TransferState.DONE, handle.error
        assert handle.nbytes == packed.nbytes + packed.buffers[0].nbytes
        received = rx.recv("req-1")  # DONE means the receiver stored it
        assert received is not None
        assert unpack_into(dst, expected_dim, DST_IDS, received) == NUM_TOKENS
        _assert_blocks_moved(src, dst, expected_dim, SRC_IDS, DST_IDS)
    finally:
        tx.close()
        rx.close()
