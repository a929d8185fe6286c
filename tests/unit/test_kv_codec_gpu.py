"""KV on a CUDA KV cache: packing into pinned host memory moves the same bytes as from a CPU cache,
landing buffers are pinned, and unpacking puts the blocks into other blocks on the GPU. Skipped without a CUDA
GPU (CI has none): run them on a machine with one."""

from __future__ import annotations

import pytest
import torch

from tetriserve.transport.kv_codec import pack, unpack_into

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
BLOCK, NUM_BLOCKS = 16, 24
SRC_IDS, DST_IDS = [7, 2, 19, 11], [0, 5, 3, 22]
NUM_TOKENS = 3 * BLOCK + 5


def _cache(fill: float | None, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (2, NUM_BLOCKS, BLOCK, 4, 32)  # vLLM's GPU layout: blocks on dimension 1
    return {
        name: (torch.zeros(shape) if fill is None else torch.randn(shape, generator=gen) + fill)
        .to(torch.bfloat16)
        .to(device)
        for name in LAYERS
    }


@pytest.mark.parametrize("pinned", [None, False], ids=["pinned", "pageable"])
def test_a_gpu_cache_packs_the_same_bytes_as_its_cpu_copy(pinned: bool | None) -> None:
    gpu = _cache(3.0, "cuda")
    from_gpu = pack(gpu, 1, SRC_IDS, NUM_TOKENS, BLOCK, pinned=pinned)
    from_cpu = pack({k: v.cpu() for k, v in gpu.items()}, 1, SRC_IDS, NUM_TOKENS, BLOCK)
    assert from_gpu.pinned is (pinned is None) and not from_cpu.pinned
    assert from_gpu.nbytes == from_cpu.nbytes and from_gpu.num_blocks == 4
    for a, b in zip(from_gpu.buffers, from_cpu.buffers, strict=True):
        assert bytes(a) == bytes(b)


def test_blocks_packed_on_the_gpu_unpack_into_other_gpu_blocks() -> None:
    src, dst = _cache(3.0, "cuda"), _cache(None, "cuda")
    packed = pack(src, 1, SRC_IDS, NUM_TOKENS, BLOCK)
    wire = [bytearray(b) for b in packed.buffers]  # what a two-sided transport hands the receiver
    assert unpack_into(dst, 1, DST_IDS, wire) == NUM_TOKENS
    for name in LAYERS:
        for s, d in zip(SRC_IDS, DST_IDS, strict=True):
            assert torch.equal(dst[name][:, d], src[name][:, s])
        untouched = [b for b in range(NUM_BLOCKS) if b not in DST_IDS]
        assert not dst[name][:, untouched].any()


def test_landing_buffers_are_pinned_where_a_gpu_is_seen() -> None:
    import numpy as np

    from tetriserve.transport.tcp import ReceivePool

    pool = ReceivePool()
    assert pool.pinned
    views = pool.views([3 << 20, 100])
    assert torch.from_numpy(np.asarray(views[0])).is_pinned()


def test_kv_from_a_gpu_cache_lands_pinned_through_tcp_and_unpacks_on_the_gpu() -> None:
    from tetriserve.transport.api import TransferState
    from tetriserve.transport.tcp import TcpTransport

    src, dst = _cache(3.0, "cuda"), _cache(None, "cuda")
    tx, rx = TcpTransport(), TcpTransport()
    try:
        packed = pack(src, 1, SRC_IDS, NUM_TOKENS, BLOCK)
        assert tx.send(rx.address, "k", packed.buffers, 30.0).wait(30.0) is TransferState.DONE
        got = rx.recv("k")
        assert got is not None
        assert unpack_into(dst, 1, DST_IDS, got) == NUM_TOKENS
    finally:
        tx.close()
        rx.close()
    for name in LAYERS:
        for s, d in zip(SRC_IDS, DST_IDS, strict=True):
            assert torch.equal(dst[name][:, d], src[name][:, s])
