"""Tests for transport.kv_packer: parked KV is packed on the packer thread, and vLLM frees a request's blocks
only once its packs are done and vLLM has finished it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
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


@dataclass
class Rig:
    transport: GatedTransport
    packer: KVPacker
    layers: dict[str, torch.Tensor]
    packed: list[int]  # the sizes ``on_packed`` reported


@pytest.fixture
def rig() -> Iterator[Rig]:
    transport, packed = GatedTransport(), []
    layers = cpu_layout(12, torch.float32)
    packer = KVPacker(layers, 0, BLOCK, transport, on_packed=lambda key, nbytes: packed.append(nbytes))
    try:
        yield Rig(transport, packer, layers, packed)
    finally:
        packer.close()
        transport.close()


def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_packs_on_its_own_thread_and_parks_the_blocks(rig: Rig) -> None:
    rig.packer.submit(SaveSpec("r1", "k1", tuple(SRC_IDS), NUM_TOKENS))
    _until(lambda: rig.transport.landed("k1"))
    assert rig.transport.threads == ["kv-packer"]
    dst = cpu_layout(12, torch.float32, fill="zeros")
    assert unpack_into(dst, 0, DST_IDS, rig.transport.recv("k1")) == NUM_TOKENS
    _assert_blocks_moved(rig.layers, dst, 0, SRC_IDS, DST_IDS)
    _until(lambda: rig.packed != [])
    assert rig.packed == [sum(rig.layers[n][SRC_IDS].numel() * 4 for n in rig.layers)]


def test_blocks_free_once_packed_and_finished_whichever_comes_last(rig: Rig) -> None:
    # finished by vLLM first, packed later: reported only after the pack
    rig.transport.gate.clear()
    rig.packer.submit(SaveSpec("early", "k-early", tuple(SRC_IDS), NUM_TOKENS))
    assert rig.packer.finished_sending({"early", "never-saved"}) is None
    rig.transport.gate.set()
    rig.packer.wait_for(["early"])
    assert rig.packer.finished_sending(set()) == {"early"}
    assert rig.packer.finished_sending(set()) is None  # once only
    # packed first, finished later (a slice move's request runs on after its save)
    rig.packer.submit(SaveSpec("late", "k-late", tuple(SRC_IDS), NUM_TOKENS))
    rig.packer.wait_for(["late"])
    assert rig.packer.finished_sending(set()) is None
    assert rig.packer.finished_sending({"late"}) == {"late"}
    # a request that never had a pack is not vLLM's to free through us
    assert rig.packer.finished_sending({"plain"}) is None


def test_two_packs_of_one_request_both_done_before_its_blocks_free(rig: Rig) -> None:
    rig.packer.submit(SaveSpec("r", "k#0", tuple(SRC_IDS[:2]), 2 * BLOCK))
    rig.transport.gate.clear()
    rig.packer.submit(SaveSpec("r", "k#1", tuple(SRC_IDS), NUM_TOKENS))
    time.sleep(0.05)
    assert rig.packer.finished_sending({"r"}) is None
    rig.transport.gate.set()
    rig.packer.wait_for(["r"])
    assert rig.packer.finished_sending(set()) == {"r"}


def test_a_failed_pack_marks_its_key_failed_and_still_frees_the_blocks(rig: Rig) -> None:
    rig.packer.submit(SaveSpec("bad", "k-bad", (1,), NUM_TOKENS))  # 9 tokens need 3 blocks, it names one
    rig.packer.wait_for(["bad"])
    assert "packing its KV failed" in (rig.transport.failed("k-bad") or "")
    assert not rig.transport.landed("k-bad")
    assert rig.packer.finished_sending({"bad"}) == {"bad"}
