"""The one-sided part of the transport contract, on the backends that offer it (``shm``, and ``auto``
between endpoints of one host): a reader pulls what a publisher published, in place, each part as it comes; a
key that fails, is discarded, misses the deadline or whose publisher dies fails the pull on the reader's side at
once; the publisher's slabs come back once the reader lets go. Backends and peers without it say so."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.transport_support import poll, recv_within, unique
from tetriserve.transport import parts
from tetriserve.transport.api import TransferState

ONE_SIDED = ["shm", "auto"]


@pytest.fixture(params=ONE_SIDED)
def pub_reader(request: pytest.FixtureRequest, make: Callable[..., Any]) -> tuple[Any, Any]:
    """(publisher, reader) on one host."""
    host = unique("host")
    return make(str(request.param), host=host), make(str(request.param), host=host)


def test_a_published_key_is_pulled_in_place_and_taken_from_the_publisher(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    payload = [b"header", bytes(range(256)) * 4096, b"", b"tail"]
    pub.publish("k", payload)
    assert pub.lends_to(reader.address) and reader.lends_to(pub.address)
    lent = pub.lending("k", 10.0)  # the publisher's side of it, as a send's handle
    handle = reader.pull(pub.address, "k", 10.0)
    assert handle is not None and handle.wait(10.0) is TransferState.DONE, handle.error
    assert lent.wait(10.0) is TransferState.DONE and lent.nbytes == sum(map(len, payload))
    got = recv_within(reader, "k")
    assert [bytes(b) for b in got] == payload
    assert all(not memoryview(b).readonly for b in got)  # the contract's writable bytes
    assert handle.nbytes == sum(map(len, payload))
    assert pub.recv("k") is None  # taken by the pull
    assert pub.stats().bytes_sent == sum(map(len, payload)) and reader.stats().bytes_received == handle.nbytes


def test_parts_are_pulled_as_they_are_published_and_the_key_lands_whole(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    handle = reader.pull(pub.address, "k", 10.0)  # before anything is published
    assert handle is not None
    pub.publish(parts.part_key("k", 0, False), [b"a" * 5000, b"b"])
    poll(lambda: reader.landed_bytes(parts.part_key("k", 0, False)), 10.0, "part 0 to land")
    assert handle.state is TransferState.PENDING and reader.recv("k") is None  # the key is not whole yet
    pub.publish(parts.part_key("k", 1, True), [b"c" * 7000])
    assert handle.wait(10.0) is TransferState.DONE, handle.error
    assert [bytes(b) for b in recv_within(reader, "k")] == [b"a" * 5000, b"b", b"c" * 7000]


def test_the_publishers_slabs_come_back_once_the_reader_drops_its_views(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    for i in range(12):
        pub.publish(f"k{i}", [bytearray(3 << 20)])
        handle = reader.pull(pub.address, f"k{i}", 10.0)
        assert handle is not None and handle.wait(10.0) is TransferState.DONE, handle.error
        got = recv_within(reader, f"k{i}")
        assert len(got[0]) == 3 << 20
        del got
        gc.collect()
        poll(lambda: len(pub._free) == len(pub._slabs), 10.0, "the slab to come back")
    assert len(pub._slabs) <= 2  # reused, not one per transfer


@pytest.mark.parametrize("how", ["fail", "discard"])
def test_a_key_failed_or_discarded_by_the_publisher_fails_the_pull(pub_reader: tuple[Any, Any], how: str) -> None:
    pub, reader = pub_reader
    pub.publish(parts.part_key("k", 0, False), [b"x" * 100])
    lent = pub.lending("k", 30.0)
    handle = reader.pull(pub.address, "k", 30.0)
    assert handle is not None
    poll(lambda: reader.landed_bytes(parts.part_key("k", 0, False)), 10.0, "part 0 to land")
    if how == "fail":
        pub.fail(parts.part_key("k", 1, True), "packing its KV failed")
    else:
        pub.discard("k")
    assert handle.wait(5.0) is TransferState.FAILED
    expected = "packing its KV failed" if how == "fail" else "discarded"
    assert expected in (handle.error or "") and expected in (reader.failed("k") or "")
    assert lent.wait(5.0) is TransferState.FAILED and lent.nbytes == 100


def test_a_lending_nobody_pulls_fails_past_its_deadline(make: Callable[..., Any]) -> None:
    pub = make("shm")
    lent = pub.lending("k", 0.05)
    time.sleep(0.1)
    pub.lending("other", 10.0)  # the publisher notices on its next lending
    assert lent.state is TransferState.FAILED and "not pulled" in (lent.error or "")
    assert make("tcp").lending("k", 10.0).state is TransferState.FAILED  # no pull there: nothing to wait for


def test_a_pull_past_its_deadline_fails_on_the_reader(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    started = time.monotonic()
    handle = reader.pull(pub.address, "never", 0.3)
    assert handle is not None and handle.wait(10.0) is TransferState.FAILED
    assert time.monotonic() - started < 5.0
    assert reader.failed("never") is not None


_PUBLISHER = """
import sys
from tetriserve.transport.shm import ShmTransport
from tetriserve.transport import parts
t = ShmTransport(host=sys.argv[1])
t.publish(parts.part_key("k", 0, False), [bytearray(1 << 20)])
print(t.address, flush=True)
sys.stdin.readline()
"""


def test_a_publisher_that_dies_fails_the_pull_promptly(make: Callable[..., Any]) -> None:
    host = unique("host")
    reader = make("shm", host=host)
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, host], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ))  # fmt: skip
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        handle = reader.pull(address, "k", 60.0)
        assert handle is not None
        poll(lambda: reader.landed_bytes(parts.part_key("k", 0, False)), 10.0, "part 0 to land")
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        assert handle.wait(10.0) is TransferState.FAILED
        assert time.monotonic() - started < 5.0 and reader.failed("k") is not None
        landed = reader.recv(parts.part_key("k", 0, False))  # what landed before stays readable
        assert landed is not None and len(landed[0]) == 1 << 20
    finally:
        proc.kill()
        proc.wait(10.0)


def test_no_pull_across_hosts_from_other_backends_or_when_turned_off(make: Callable[..., Any]) -> None:
    a, b = make("shm", host=unique("host")), make("shm", host=unique("host"))
    assert not a.lends_to(b.address) and b.pull(a.address, "k", 1.0) is None
    tcp = make("tcp")
    tcp.publish("k", [b"parked"])  # published as held: recv and push still work
    assert not tcp.lends_to(a.address) and tcp.pull(a.address, "k", 1.0) is None
    assert [bytes(x) for x in tcp.recv("k")] == [b"parked"]
    host = unique("host")
    off, peer = make("shm", host=host, pull=False), make("shm", host=host)
    assert not off.lends_to(peer.address) and off.pull(peer.address, "k", 1.0) is None
    off.publish("k", [b"held"])
    assert [bytes(x) for x in off.recv("k")] == [b"held"]


def test_buffers_reserved_in_a_slab_are_published_without_a_copy(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    reserved = pub.reserve([64, 2 << 20])
    reserved[0][:5] = b"hello"
    reserved[1][:] = bytes(range(256)) * (8 << 10)
    pub.publish("k", reserved)
    assert len(pub._slabs) == 1  # the one slab reserved: publishing took no other
    handle = reader.pull(pub.address, "k", 10.0)
    assert handle is not None and handle.wait(10.0) is TransferState.DONE, handle.error
    got = recv_within(reader, "k")
    assert bytes(got[0][:5]) == b"hello" and bytes(got[1]) == bytes(range(256)) * (8 << 10)


def test_concurrent_pulls_from_one_publisher_each_land_their_own_parts(pub_reader: tuple[Any, Any]) -> None:
    pub, reader = pub_reader
    keys = [f"k{i}" for i in range(8)]
    handles = [reader.pull(pub.address, key, 20.0) for key in keys]  # all waiting before anything is published
    for index, last in ((0, False), (1, True)):
        for i, key in enumerate(keys):
            pub.publish(parts.part_key(key, index, last), [bytes([i, index]) * (300_000 + i)])
    for i, (key, handle) in enumerate(zip(keys, handles, strict=True)):
        assert handle is not None and handle.wait(20.0) is TransferState.DONE, handle.error
        assert [bytes(b) for b in recv_within(reader, key)] == [bytes([i, part]) * (300_000 + i) for part in (0, 1)]
    assert reader.stats().transfers_pulled == len(keys)
