"""Prefix-aware placement: the block hashes of a prompt, the scheduler's estimate of each prefill worker's cache,
and the choice between a longer hit and a shorter queue; then the GlobalScheduler placing a conversation's
turns where its prefix is."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from tests.actor_fakes import FakeHandle
from tests.data_path_support import FakeWorker
from tetriserve.common.load import PrefillLoad
from tetriserve.common.prefix_blocks import block_hashes
from tetriserve.common.stream import PlacementRequest
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.control_plane.prefix_placement import DEFAULT_BLOCKS, PrefixIndex, Queue


def test_block_hashes_chain_over_full_blocks_only() -> None:
    a = block_hashes(list(range(100)), 32)
    assert len(a) == 3  # 96 tokens in full blocks; the last 4 have no hash
    b = block_hashes([*range(64), 999, *range(65, 100)], 32)
    assert b[:2] == a[:2] and b[2] != a[2]  # the same first 64 tokens, then not
    c = block_hashes([7, *range(1, 100)], 32)
    assert all(x != y for x, y in zip(a, c, strict=True))  # a changed first token changes every later block
    assert block_hashes(list(range(100)), 32, limit=2) == a[:2]
    assert block_hashes([1, 2, 3], 32) == ()
    with pytest.raises(ValueError):
        block_hashes([1], 0)


def test_block_hashes_are_the_same_in_every_process() -> None:
    code = "from tetriserve.common.prefix_blocks import block_hashes; print(block_hashes(list(range(64)), 16))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    )
    assert out.stdout.strip() == str(block_hashes(list(range(64)), 16))


def test_the_index_holds_what_was_placed_most_recent_last_within_the_worker_s_blocks() -> None:
    idx = PrefixIndex(block_size=16)
    turn1 = block_hashes(list(range(64)), 16)  # 4 blocks
    idx.placed("p0", turn1)
    assert idx.hit("p0", turn1) == 64 and idx.hit("p1", turn1) == 0
    turn2 = block_hashes([*range(64), *range(500, 532)], 16)  # the conversation so far, 2 blocks more
    assert idx.hit("p0", turn2) == 64  # its first 4 blocks
    idx.capacity("p0", 5)
    assert idx.held("p0") == 4
    idx.placed("p0", block_hashes(list(range(1000, 1032)), 16))  # 2 new blocks: the oldest one goes
    assert idx.held("p0") == 5 and idx.hit("p0", turn1) == 0  # its first block was the least recent
    idx.capacity("p0", 0)  # unknown: the bound stays
    assert idx.held("p0") == 5
    idx.forget("p0")
    assert idx.held("p0") == 0 and idx.hit("p0", turn2) == 0
    big = PrefixIndex(16)
    big.placed("p1", tuple(range(DEFAULT_BLOCKS + 10)))
    assert big.held("p1") == DEFAULT_BLOCKS  # before a report gives the worker's size


def test_a_longer_hit_wins_only_when_the_compute_it_saves_outweighs_the_longer_queue() -> None:
    idx = PrefixIndex(block_size=16)
    prompt = block_hashes(list(range(640)), 16)  # 40 blocks
    idx.placed("p1", prompt[:30])  # p1 is expected to hold 480 of its tokens
    q = {"p0": Queue(0.0, 1e-3), "p1": Queue(0.2, 1e-3)}
    # 480 tokens at 1 ms each save 0.48 s; p1's queue is 0.2 s longer: p1
    choice = idx.prefer("p0", ["p0", "p1"], prompt, q)
    assert (choice.worker, choice.hit_tokens, choice.by_prefix) == ("p1", 480, True)
    q["p1"] = Queue(0.6, 1e-3)  # now the queue costs more than the hit saves: least-load's choice stands
    assert idx.prefer("p0", ["p0", "p1"], prompt, q).worker == "p0"
    idx.placed("p0", prompt[:30])  # equal hits: least-load's choice, whatever the queues
    q["p1"] = Queue(0.0, 1e-3)
    assert idx.prefer("p0", ["p0", "p1"], prompt, q).worker == "p0"


def test_an_unmeasured_pace_takes_the_others_and_with_none_the_longest_hit_wins() -> None:
    idx = PrefixIndex(block_size=16)
    prompt = block_hashes(list(range(320)), 16)
    idx.placed("p1", prompt[:10])
    idx.placed("p2", prompt[:5])
    # p1 and p2 have not measured their pace: p0's 1 ms a token prices p1's 160 extra tokens at 0.16 s, less
    # its 0.05 s longer queue, above p2's 80 (0.08 s); with 0.1 s of queue p1 gains 0.06 s only, and p2 wins
    q = {"p0": Queue(0.0, 1e-3), "p1": Queue(0.05, 0.0), "p2": Queue(0.0, 0.0)}
    assert idx.prefer("p0", ["p0", "p1", "p2"], prompt, q).worker == "p1"
    q["p1"] = Queue(0.1, 0.0)
    assert idx.prefer("p0", ["p0", "p1", "p2"], prompt, q).worker == "p2"
    none = {w: Queue(0.0, 0.0) for w in q}
    assert idx.prefer("p0", ["p0", "p1", "p2"], prompt, none).worker == "p1"  # 160 tokens beat p2's 80


def _scheduler(block_size: int = 16) -> GlobalScheduler:
    workers = {f"prefill-{i}": FakeHandle(FakeWorker(f"prefill-{i}")) for i in range(2)}
    return GlobalScheduler(workers, prefix_block_size=block_size)  # type: ignore[arg-type]


def _loads(gs: GlobalScheduler, incarnation: int = 0, blocks: int = 1000) -> None:
    loads = [PrefillLoad(w, 0, 0, 0, time.time(), incarnation, total_kv_blocks=blocks) for w in gs.prefill]
    asyncio.run(gs.update_prefill_loads(loads))


def test_the_scheduler_places_a_conversation_s_next_turn_where_its_prefix_is() -> None:
    gs = _scheduler()
    _loads(gs)
    now = time.time()

    def place(rid: str, tokens: list[int]) -> str | None:
        meta = PlacementRequest(rid, len(tokens), 8, now, prefix_blocks=block_hashes(tokens, 16))
        return asyncio.run(gs.place(meta)).prefill_worker

    turn1 = list(range(200))
    assert place("t1", turn1) == "prefill-0"  # nothing shared: least load, ties by name
    assert place("x", list(range(900, 950))) == "prefill-1"
    assert place("y", list(range(2000, 2050))) == "prefill-0"
    # prefill-0 has two prompts in prefill, prefill-1 one: least load says prefill-1, but turn 2 shares turn 1's
    # 192 tokens in full blocks, and with no pace measured yet the longer hit wins
    assert place("t2", [*turn1, *range(300, 340)]) == "prefill-0"
    assert asyncio.run(gs.status())["placements"] == {"placed_by_prefix": 1, "prefix_hit_tokens": 192}
    # a new life of the workers: their caches are gone, and so is the estimate
    _loads(gs, incarnation=1)
    assert gs.prefix is not None and gs.prefix.held("prefill-0") == 0


def test_without_hashes_or_with_placement_off_it_is_least_load() -> None:
    gs = _scheduler(block_size=0)
    assert gs.prefix is None
    gs.prefill_loads = {w: PrefillLoad(w, 0, 0, 0, 0.0) for w in gs.prefill}
    now = time.time()
    a = asyncio.run(gs.place(PlacementRequest("a", 10, 8, now, prefix_blocks=(1, 2))))
    b = asyncio.run(gs.place(PlacementRequest("b", 10, 8, now, prefix_blocks=(1, 2))))
    assert {a.prefill_worker, b.prefill_worker} == {"prefill-0", "prefill-1"}
    assert asyncio.run(gs.status())["placements"] == {"placed_by_prefix": 0, "prefix_hit_tokens": 0}
