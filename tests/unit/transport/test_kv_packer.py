"""Tests for transport.kv_packer: parked KV is packed on the packer thread, and vLLM frees a request's blocks
only once its packs are done and vLLM has finished it."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from tests.transport_support import unique
from tests.unit.test_kv_codec import BLOCK, DST_IDS, NUM_TOKENS, SRC_IDS, _assert_blocks_moved, cpu_layout
from tetriserve.transport.inproc import InProcTransport
from tetriserve.transport.kv_codec import unpack_into
from tetriserve.transport.kv_packer import KVPacker, SaveSpec


class GatedTransport(InProcTransport):
    """Holds only once ``gate`` is set, and notes the thread each hold ran on."""

    def __init__(self) -> None:
        super().__init__(unique("packer"))
        self.gate = threading.Event()
        self.gate.set()
        self.threads: list[str] = []

    def hold(self, key: str, buffers: Any, expires: bool = True) -> None:
        self.gate.wait(10)
        self.threads.append(threading.current_thread().name)
        super().hold(key, buffers, expires)


def _packer(transport: Any, packed: list[int] | None = None) -> tuple[KVPacker, dict[str, torch.Tensor]]:
    layers = cpu_layout(12, torch.float32)
    on_packed = (lambda key, nbytes: packed.append(nbytes)) if packed is not None else (lambda key, nbytes: None)
    return KVPacker(layers, 0, BLOCK, transport, on_packed=on_packed), layers


def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_packs_on_its_own_thread_and_parks_the_blocks() -> None:
    transport, packed = GatedTransport(), []
    packer, layers = _packer(transport, packed)
    try:
        packer.submit(SaveSpec("r1", "k1", tuple(SRC_IDS), NUM_TOKENS))
        _until(lambda: transport.landed("k1"))
        assert transport.threads == ["kv-packer"]
        dst = cpu_layout(12, torch.float32, fill="zeros")
        assert unpack_into(dst, 0, DST_IDS, transport.recv("k1")) == NUM_TOKENS
        _assert_blocks_moved(layers, dst, 0, SRC_IDS, DST_IDS)
        _until(lambda: packed != [])
        assert packed == [sum(layers[n][SRC_IDS].numel() * 4 for n in layers)]
    finally:
        packer.close()
        transport.close()


def test_blocks_free_once_packed_and_finished_whichever_comes_last() -> None:
    transport = GatedTransport()
    packer, _ = _packer(transport)
    try:
        # finished by vLLM first, packed later: reported only after the pack
        transport.gate.clear()
        packer.submit(SaveSpec("early", "k-early", tuple(SRC_IDS), NUM_TOKENS))
        assert packer.finished_sending({"early", "never-saved"}) is None
        transport.gate.set()
        packer.wait_for(["early"])
        assert packer.finished_sending(set()) == {"early"}
        assert packer.finished_sending(set()) is None  # once only
        # packed first, finished later (a slice move's request runs on after its save)
        packer.submit(SaveSpec("late", "k-late", tuple(SRC_IDS), NUM_TOKENS))
        packer.wait_for(["late"])
        assert packer.finished_sending(set()) is None
        assert packer.finished_sending({"late"}) == {"late"}
        # a request that never had a pack is not vLLM's to free through us
        assert packer.finished_sending({"plain"}) is None
    finally:
        packer.close()
        transport.close()


def test_two_packs_of_one_request_both_done_before_its_blocks_free() -> None:
    transport = GatedTransport()
    packer, _ = _packer(transport)
    try:
        packer.submit(SaveSpec("r", "k#0", tuple(SRC_IDS[:2]), 2 * BLOCK))
        transport.gate.clear()
        packer.submit(SaveSpec("r", "k#1", tuple(SRC_IDS), NUM_TOKENS))
        time.sleep(0.05)
        assert packer.finished_sending({"r"}) is None
        transport.gate.set()
        packer.wait_for(["r"])
        assert packer.finished_sending(set()) == {"r"}
    finally:
        packer.close()
        transport.close()


def test_a_failed_pack_marks_its_key_failed_and_still_frees_the_blocks() -> None:
    transport = GatedTransport()
    packer, _ = _packer(transport)
    try:
        packer.submit(SaveSpec("bad", "k-bad", (1,), NUM_TOKENS))  # 9 tokens need 3 blocks, it names one
        packer.wait_for(["bad"])
        assert "packing its KV failed" in (transport.failed("k-bad") or "")
        assert not transport.landed("k-bad")
        assert packer.finished_sending({"bad"}) == {"bad"}
    finally:
        packer.close()
        transport.close()
