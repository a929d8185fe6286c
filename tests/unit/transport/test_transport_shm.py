"""The shared-memory backend: bytes through /dev/shm between processes of one host, inline to other hosts,
and nothing stranded in /dev/shm whatever happens to the peer (issue #16)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.transport_support import recv_within as _recv
from tetriserve.transport.api import TransferState
from tetriserve.transport.shm import PREFIX, SHM_DIR, host_id, split_address

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(PREFIX + "*")}


def test_same_host_bytes_go_through_a_segment_the_receiver_maps_and_nothing_is_left(make: Callable[..., Any]) -> None:
    tx, rx = make("shm"), make("shm")
    before = _segments()
    assert rx.address.startswith(f"shm://{host_id()}@127.0.0.1:")
    big = bytes(range(256)) * 8192  # 2 MiB
    assert tx.send(rx.address, "k", [big, b"", b"tail"], 5.0).wait(5.0) is TransferState.DONE
    got = _recv(rx, "k")
    assert [bytes(b) for b in got] == [big, b"", b"tail"]
    assert all(isinstance(b, memoryview) for b in got)  # mapped, not copied
    got[0][:4] = b"edit"  # writable: the KV unpack reads it with torch.frombuffer
    assert _segments() == before  # the receiver unlinked the name on mapping it
    assert rx.stats().bytes_received == len(big) + 4


def test_a_peer_on_another_host_gets_the_bytes_inline(make: Callable[..., Any]) -> None:
    tx, rx = make("shm"), make("shm")
    _, hostport = split_address(rx.address)
    elsewhere = f"shm://0123456789ab@{hostport}"  # as the address of an endpoint on another host reads
    assert tx.send(elsewhere, "k", [b"inline bytes"], 5.0).wait(5.0) is TransferState.DONE
    got = _recv(rx, "k")
    assert got == [bytearray(b"inline bytes")] and isinstance(got[0], bytearray)
    assert tx.send(hostport, "plain", [b"to a tcp address"], 5.0).wait(5.0) is TransferState.DONE  # a tcp peer


def test_no_segment_is_stranded_when_the_receiver_is_gone_or_drops_the_key(
    make: Callable[..., Any], dead_port: str
) -> None:
    tx, rx = make("shm"), make("shm")
    before = _segments()
    gone = f"shm://{host_id()}@{dead_port}"
    handle = tx.send(gone, "lost", [b"x" * 100_000], 1.0)
    assert handle.wait(5.0) is TransferState.FAILED
    assert rx.discard("late") is False
    dropped = tx.send(rx.address, "late", [b"y" * 100_000], 5.0)
    assert dropped.wait(5.0) is TransferState.FAILED and "discarded" in (dropped.error or "")
    assert _segments() == before
