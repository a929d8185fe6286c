"""``hold``: a producer parks data in its own endpoint and forwards it once it knows the destination."""

from __future__ import annotations

import time

import pytest

from tetriserve.transport.api import TransferState, Transport

# ``pair`` (sender, receiver of either backend, closed at teardown) comes from conftest.py


def test_held_data_is_taken_once_and_not_counted_as_received(pair: tuple[Transport, Transport]) -> None:
    a, _ = pair
    a.hold("k", [memoryview(b"abc"), bytearray(b"de")])
    assert a.stats().bytes_received == 0 and a.stats().transfers_received == 0
    got = a.recv("k")
    assert got is not None and [bytes(x) for x in got] == [b"abc", b"de"]
    assert a.recv("k") is None


def test_held_data_forwards_to_another_endpoint(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    a.hold("k", [b"kv-blocks"])
    buffers = a.recv("k")
    assert buffers is not None
    assert a.send(b.address, "k", buffers, 5.0).wait(5.0) is TransferState.DONE
    landed = b.recv("k")
    assert landed is not None and bytes(landed[0]) == b"kv-blocks"
    assert b.stats().bytes_received == len(b"kv-blocks")


def test_discard_before_hold_drops_the_parked_data(pair: tuple[Transport, Transport]) -> None:
    a, _ = pair
    a.discard("gone")
    a.hold("gone", [b"x"])
    assert a.recv("gone") is None


def test_data_held_without_expiry_outlives_the_ttl_until_taken_or_discarded() -> None:
    """A swapped-out request's KV may wait longer than any transfer; only its owner drops it."""
    import time

    from tetriserve.transport.inproc import InProcTransport

    t = InProcTransport("hold-no-expiry", ttl_s=0.001)
    try:
        t.hold("swap", [b"kv"], expires=False)
        t.hold("parked", [b"kv"])
        time.sleep(0.02)
        assert t.recv("parked") is None  # past the TTL
        got = t.recv("swap")
        assert got is not None and bytes(got[0]) == b"kv"
        t.hold("swap2", [b"kv"], expires=False)
        assert t.discard("swap2") and t.recv("swap2") is None
    finally:
        t.close()


def test_the_kv_lease_of_the_config_reaches_the_endpoint_and_frees_parked_kv() -> None:
    """``transport.lease_s``: KV parked in a worker's endpoint that nobody takes is dropped at the lease's end."""
    from tetriserve.common.config import ClusterConfig
    from tetriserve.transport import endpoints

    config = ClusterConfig.load(overrides={"transport.lease_s": 91.0})
    assert config.transport.lease_s == 91.0
    with pytest.raises(ValueError, match=r"transport\.lease_s must be at least"):
        ClusterConfig.load(overrides={"transport.lease_s": 10.0})  # shorter than a parked request may wait
    name = f"lease-test-{time.monotonic_ns()}"
    endpoint = endpoints.get_or_create(name, "tcp", "127.0.0.1:0", lease_s=0.05)
    try:
        endpoint.hold("parked", [b"kv" * 100])
        deadline = time.monotonic() + 5.0
        while endpoint.stats().expired < 1:
            assert time.monotonic() < deadline, "the parked KV outlived its lease"
            endpoint.recv("someone-else")  # the store sweeps on use
            time.sleep(0.02)
        assert endpoint.recv("parked") is None
    finally:
        endpoints.close_all()
