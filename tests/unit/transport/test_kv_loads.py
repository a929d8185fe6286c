"""Tests for transport.kv_loads: a decode engine's loads. KV that lands after its request was scheduled is copied
into the blocks on the packer thread, and vLLM hears the load is over only once the copy is; a small landed load is
copied within the step; failures name their blocks in the pass that reports the load over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from tests.unit.test_kv_codec import BLOCK, DST_IDS, NUM_TOKENS, SRC_IDS, _assert_blocks_moved, _wire, cpu_layout
from tests.unit.transport.test_kv_packer import GatedTransport
from tetriserve.transport.kv_codec import pack
from tetriserve.transport.kv_counters import counters
from tetriserve.transport.kv_loads import KVLoads, LoadSpec
from tetriserve.transport.kv_packer import KVPacker, SaveSpec


@dataclass
class LoadRig:
    transport: GatedTransport
    packer: KVPacker
    loads: KVLoads
    src: dict[str, torch.Tensor]  # the prefill engine's blocks the KV comes from
    dst: dict[str, torch.Tensor]  # the decode engine's, the packer's own


def _rig(deadline_s: float) -> Iterator[LoadRig]:
    transport = GatedTransport()
    src, dst = cpu_layout(12, torch.float32), cpu_layout(12, torch.float32, fill="zeros")
    packer = KVPacker(dst, 0, BLOCK, transport)
    try:
        yield LoadRig(transport, packer, KVLoads(transport, packer, dst, 0, deadline_s), src, dst)
    finally:
        transport.gate.set()
        packer.close()
        transport.close()


@pytest.fixture
def rig() -> Iterator[LoadRig]:
    yield from _rig(deadline_s=10.0)


def _land(rig: LoadRig, key: str, heads: int = 2) -> None:
    src = rig.src if heads == 2 else cpu_layout(12, torch.float32, heads=heads)
    rig.transport.hold(key, _wire(pack(src, 0, SRC_IDS, NUM_TOKENS, BLOCK).buffers))


def _hold_the_packer(rig: LoadRig) -> None:
    """Keep the packer thread busy (a pack that waits for the gate) until ``rig.transport.gate`` is set."""
    rig.transport.gate.clear()
    rig.packer.submit(SaveSpec("other", "other-key", (0,), BLOCK))


def _finished_within(rig: LoadRig, timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while not (done := rig.loads.finished()):
        assert time.monotonic() < deadline, "no load reported over"
        time.sleep(0.005)
    return done


def test_kv_landing_after_the_schedule_is_copied_in_on_the_packer_thread_not_in_the_step(rig: LoadRig) -> None:
    before = counters()
    rig.loads.start([LoadSpec("r", "k", tuple(DST_IDS), NUM_TOKENS)], [])
    assert rig.loads.finished() is None  # nothing landed yet
    _land(rig, "k")
    _hold_the_packer(rig)
    rig.loads.start([], [])  # the step hands the copy over and goes on
    time.sleep(0.05)
    assert rig.loads.finished() is None and counters().pending_loads == 1  # still copying: vLLM waits
    assert not rig.dst[next(iter(rig.dst))].any()
    rig.transport.gate.set()
    assert _finished_within(rig) == {"r"}
    assert rig.loads.errors() == set()
    _assert_blocks_moved(rig.src, rig.dst, 0, SRC_IDS, DST_IDS)
    after = counters()
    assert (after.requests_loaded - before.requests_loaded, after.tokens_loaded - before.tokens_loaded) == (
        1,
        NUM_TOKENS,
    )
    assert after.requests_loaded_off_step - before.requests_loaded_off_step == 1 and after.pending_loads == 0


def test_a_small_landed_load_is_copied_within_the_step(rig: LoadRig) -> None:
    _land(rig, "k")
    before = counters()
    rig.loads.start([LoadSpec("r", "k", tuple(DST_IDS), NUM_TOKENS, landed=True)], [])
    _assert_blocks_moved(rig.src, rig.dst, 0, SRC_IDS, DST_IDS)  # before this step's forward pass
    assert rig.loads.finished() is None and rig.loads.errors() == set()  # vLLM asks nothing more of it
    after = counters()
    assert after.requests_loaded - before.requests_loaded == 1
    assert after.requests_loaded_off_step == before.requests_loaded_off_step


def test_a_load_cancelled_while_being_copied_frees_its_blocks_only_once_the_copy_is_done(rig: LoadRig) -> None:
    before = counters()
    rig.loads.start([LoadSpec("r", "k", tuple(DST_IDS), NUM_TOKENS)], [])
    _land(rig, "k")
    _hold_the_packer(rig)
    rig.loads.start([], [])
    rig.loads.start([], [("r", "k")])  # aborted: its blocks must not go to another request mid-copy
    assert rig.loads.finished() is None
    rig.transport.gate.set()
    assert _finished_within(rig) == {"r"}
    assert rig.loads.errors() == set() and counters().requests_loaded == before.requests_loaded


def test_a_refused_payload_reports_its_blocks_as_load_errors_in_the_pass_that_ends_the_load(rig: LoadRig) -> None:
    rig.loads.start([LoadSpec("r", "k", tuple(DST_IDS), NUM_TOKENS)], [])
    _land(rig, "k", heads=3)  # another model's KV: the copy refuses it
    rig.loads.start([], [])
    assert _finished_within(rig) == {"r"}
    assert rig.loads.errors() == set(DST_IDS)
    assert not rig.dst[next(iter(rig.dst))].any()


def test_a_load_past_its_deadline_fails_with_its_blocks() -> None:
    for rig in _rig(deadline_s=0.05):
        rig.loads.start([LoadSpec("r", "k", tuple(DST_IDS), NUM_TOKENS)], [])
        time.sleep(0.1)
        rig.loads.start([], [])
        assert rig.loads.finished() == {"r"} and rig.loads.errors() == set(DST_IDS)
        _land(rig, "k")  # too late: dropped on landing, nobody waits for it
        assert not rig.transport.landed("k")
