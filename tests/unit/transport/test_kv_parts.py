"""Tests for KV in parts (transport/parts.py): how a producer splits a prompt's KV by chunk, how a landing area
answers for the whole key, and how the codec unpacks parts one after another."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_kv_codec import BLOCK, _assert_blocks_moved, _wire, cpu_layout
from tetriserve.transport import parts
from tetriserve.transport.kv_codec import pack, payload_bytes, unpack_into
from tetriserve.transport.store import ReceiveStore


def test_a_producer_parks_the_blocks_each_chunk_filled_and_the_rest_last() -> None:
    # 10 tokens of 4-token blocks, computed in chunks of 3, 3 and 4 tokens
    saved = index = 0
    got = []
    for computed in (3, 6, 10):
        part = parts.next_part("k", 10, saved, index, computed, BLOCK)
        if part is None:
            got.append(None)
            continue
        key, start, end, tokens = part
        got.append((key, start, end, tokens))
        saved, index = end, index + 1
    assert got == [None, ("k#part0", 0, 1, 4), ("k#part1.last", 1, 3, 6)]
    # all at once (a slice move, a short prompt): one last part
    assert parts.next_part("k", 10, 0, 0, 10, BLOCK) == ("k#part0.last", 0, 3, 10)
    assert parts.split("req@2#part3.last") == ("req@2", 3, True) and parts.split("req@2") is None
    assert parts.is_last("k#part1.last") and parts.is_last("k") and not parts.is_last("k#part0")


def test_the_store_answers_for_the_key_once_every_part_has_landed() -> None:
    store = ReceiveStore()
    store.put("k#part1", [b"c", b"d"])
    store.put("k#part2.last", [b"e"])
    assert not store.has("k") and store.take("k") is None  # part 0 is missing
    assert store.size("k") is None
    store.put("k#part0", [b"a", b"b"])
    assert store.has("k")
    assert store.size("k") == 5  # every part's bytes, nothing taken
    assert store.take("k") == [b"a", b"b", b"c", b"d", b"e"]
    assert not store.has("k") and len(store) == 0  # taken with its parts
    store.put("whole", [b"x"])
    assert store.take("whole") == [b"x"]  # a key sent whole is unchanged


def test_discarding_a_key_drops_its_parts_and_those_landing_later() -> None:
    store = ReceiveStore()
    store.put("k#part0", [b"a"])
    store.put("other#part0.last", [b"o"])
    assert store.discard("k")
    assert not store.put("k#part1.last", [b"late"])
    assert len(store) == 1 and store.take("other") == [b"o"]


def test_a_part_that_fails_fails_its_key() -> None:
    store = ReceiveStore()
    store.put("k#part0", [b"a"])
    store.fail("k#part1.last", "sender died")
    assert store.failed("k") == "sender died"


def test_parts_unpack_into_the_blocks_of_the_whole() -> None:
    src = cpu_layout(12, torch.float32)
    src_ids, dst_ids = [5, 2, 9], [1, 7, 3]
    tokens = 2 * BLOCK + 1
    first = pack(src, 0, src_ids[:2], 2 * BLOCK, BLOCK)  # the blocks of the first chunk
    rest = pack(src, 0, src_ids[2:], 1, BLOCK)  # the last part: the partial third block
    dst = cpu_layout(12, torch.float32, fill="zeros")
    assert unpack_into(dst, 0, dst_ids, _wire(first.buffers) + _wire(rest.buffers)) == tokens
    assert payload_bytes(first.buffers + rest.buffers) == first.nbytes + rest.nbytes  # headers not counted
    _assert_blocks_moved(src, dst, 0, src_ids, dst_ids)


def test_a_part_before_the_last_must_end_on_a_block_boundary() -> None:
    src = cpu_layout(12, torch.float32)
    ragged = pack(src, 0, [5], 3, BLOCK)
    rest = pack(src, 0, [2], 2, BLOCK)
    dst = cpu_layout(12, torch.float32, fill="zeros")
    with pytest.raises(ValueError, match="ends inside a block"):
        unpack_into(dst, 0, [1, 7], _wire(ragged.buffers) + _wire(rest.buffers))
    assert not dst[next(iter(dst))].any()  # nothing written
