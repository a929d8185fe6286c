"""The shared-memory backend: bytes through reused, registered slabs between processes of one host,
mapped not copied by the receiver, a slab reused only once every view of its transfer is gone; inline over TCP
to other hosts."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from tests.transport_support import recv_within as _recv
from tetriserve.transport.api import TransferState
from tetriserve.transport.shm import host_id, split_address


def _send(tx: Any, rx: Any, key: str, buffers: list[bytes]) -> Any:
    handle = tx.send(rx.address, key, buffers, 5.0)
    assert handle.wait(5.0) is TransferState.DONE, handle.error
    return _recv(rx, key)


def test_same_host_bytes_land_in_a_mapped_slab_without_a_copy(make: Callable[..., Any]) -> None:
    tx, rx = make("shm"), make("shm")
    assert rx.address.startswith(f"shm://{host_id()}@127.0.0.1:")
    big = bytes(range(256)) * 8192  # 2 MiB
    got = _send(tx, rx, "k", [big, b"", b"tail"])
    assert [bytes(b) for b in got] == [big, b"", b"tail"]
    assert all(isinstance(b, memoryview) and not b.readonly for b in got)  # writable views of the slab
    got[0][:4] = b"edit"  # the KV unpack reads (and may write) them in place
    assert rx.stats().bytes_received == len(big) + 4


def test_a_slab_comes_back_only_once_every_view_of_its_transfer_is_dropped(make: Callable[..., Any]) -> None:
    tx, rx = make("shm"), make("shm")
    kept = _send(tx, rx, "kept", [b"a" * 300_000])  # held on to: its slab stays lent
    for i in range(4):
        got = _send(tx, rx, f"k{i}", [bytes([i]) * 300_000])
        assert bytes(got[0]) == bytes([i]) * 300_000
        del got
        gc.collect()
    assert bytes(kept[0]) == b"a" * 300_000  # never overwritten by a later transfer
    assert len(tx._slabs) == 2  # kept's, and one every later transfer reused: free again once its views went
    del kept
    gc.collect()
    after = _send(tx, rx, "after", [b"z" * 10])  # its slab taken, the other one back in the pool
    assert len(tx._free) == len(tx._slabs) - 1
    del after
    gc.collect()
    _send(tx, rx, "again", [b"y" * 10])
    assert len(tx._slabs) == 2  # nothing new: both came back


def test_past_the_pool_a_transfer_gets_a_slab_of_its_own(make: Callable[..., Any]) -> None:
    tx, rx = make("shm", pool_bytes=0), make("shm")
    got = _send(tx, rx, "big", [b"q" * 3_000_000])
    assert bytes(got[0]) == b"q" * 3_000_000 and not tx._slabs


def test_a_peer_on_another_host_gets_the_bytes_inline(make: Callable[..., Any]) -> None:
    tx, rx = make("shm"), make("shm")
    _, hostport = split_address(rx.address)
    elsewhere = f"shm://0123456789ab@{hostport}"  # as the address of an endpoint on another host reads
    assert tx.send(elsewhere, "k", [b"inline bytes"], 5.0).wait(5.0) is TransferState.DONE
    got = _recv(rx, "k")
    assert got == [bytearray(b"inline bytes")] and isinstance(got[0], bytearray)
    assert tx.send(hostport, "plain", [b"to a tcp address"], 5.0).wait(5.0) is TransferState.DONE  # a tcp peer


def test_a_dropped_key_frees_its_slab_at_once_and_a_gone_receiver_fails_the_send(
    make: Callable[..., Any], dead_port: str
) -> None:
    tx, rx = make("shm"), make("shm")
    assert rx.discard("late") is False
    dropped = tx.send(rx.address, "late", [b"y" * 100_000], 5.0)
    assert dropped.wait(5.0) is TransferState.FAILED and "discarded" in (dropped.error or "")
    assert len(tx._free) == len(tx._slabs) == 1  # nothing of it is held there
    gone = tx.send(f"shm://{host_id()}@{dead_port}", "lost", [b"x" * 100_000], 1.0)
    assert gone.wait(5.0) is TransferState.FAILED


def test_slabs_lent_to_a_receiver_that_went_away_are_reclaimed_when_the_pool_runs_out(
    make: Callable[..., Any],
) -> None:
    tx, gone, rx = make("shm", pool_bytes=2 << 20), make("shm"), make("shm")
    held = [_send(tx, gone, f"k{i}", [b"h" * 500_000]) for i in range(2)]  # both 1 MiB slabs lent there
    assert len(tx._slabs) == 2 and not tx._free
    gone.close()  # its process ended, say: those slabs will never be released
    got = _send(tx, rx, "next", [b"n" * 500_000])
    assert bytes(got[0]) == b"n" * 500_000
    assert len(tx._slabs) == 1 and next(iter(tx._slabs.values())).pooled  # a pooled slab again, not a one-off
    assert all(bytes(h[0]) == b"h" * 500_000 for h in held)  # what the old receiver held was never touched
