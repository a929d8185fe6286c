"""Link emulation over a real backend: transfers take the emulated link's time, queue behind each
other on it, and fail at their deadline when the link is too slow for it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from tests.transport_support import recv_within as _recv
from tetriserve.common.config import ClusterConfig
from tetriserve.transport.api import TransferState
from tetriserve.transport.emulate import EmulatedLink


def _link(make: Callable[..., Any], gbps: float, latency_us: float = 0.0) -> Any:
    return EmulatedLink(make("tcp"), gbps, latency_us)


def test_a_transfer_takes_the_emulated_links_time_and_lands_intact(make: Callable[..., Any]) -> None:
    tx, rx = _link(make, gbps=0.1, latency_us=20_000), make("tcp")  # 1 MB at 0.1 Gb/s: 80 ms, + 20 ms
    payload = bytes(range(250)) * 4000
    t0 = time.monotonic()
    handle = tx.send(rx.address, "k", [payload], 5.0)
    assert rx.recv("k") is None  # nothing yet: it is on the link
    assert handle.wait(5.0) is TransferState.DONE, handle.error
    assert bytes(_recv(rx, "k")[0]) == payload
    assert time.monotonic() - t0 >= 0.1 - 0.005
    assert tx.stats().transfers_sent == 1  # the real backend sent it


def test_transfers_queue_behind_each_other_on_the_link(make: Callable[..., Any]) -> None:
    tx, rx = _link(make, gbps=0.1), make("tcp")  # 500 kB each: 40 ms on the link
    t0 = time.monotonic()
    first, second = (tx.send(rx.address, k, [b"x" * 500_000], 5.0) for k in ("a", "b"))
    assert first.wait(5.0) is TransferState.DONE and second.wait(5.0) is TransferState.DONE
    assert first.finished is not None and second.finished is not None
    assert second.finished - t0 >= 0.08 - 0.005 and second.finished >= first.finished


def test_a_link_too_slow_for_the_deadline_fails_the_send_at_the_deadline(make: Callable[..., Any]) -> None:
    tx, rx = _link(make, gbps=0.001), make("tcp")  # 1 MB at 1 Mb/s: 8 s
    handle = tx.send(rx.address, "slow", [b"s" * 1_000_000], 0.2)
    assert handle.wait(5.0) is TransferState.FAILED and "emulated link" in (handle.error or "")
    assert rx.recv("slow") is None
    pending = tx.send(rx.address, "never", [b"n" * 1_000_000], 30.0)
    tx.close()
    assert pending.wait(5.0) is TransferState.FAILED


def test_the_config_takes_a_link_to_emulate_and_refuses_a_bad_one() -> None:
    cfg = ClusterConfig.load(overrides={"transport.backend": "shm", "transport.emulate.gbps": 10})
    assert cfg.transport.emulate is not None and cfg.transport.emulate.gbps == 10
    assert cfg.transport.emulate.latency_us == 0
    assert ClusterConfig.load(overrides={"transport": "tcp"}).transport.emulate is None
    with pytest.raises(ValidationError, match="gbps"):
        ClusterConfig.load(overrides={"transport.emulate.gbps": 0})


def test_the_mock_sends_only_the_metadata_and_the_receiver_gets_zero_kv_of_the_right_size() -> None:
    from tetriserve.transport.mock import MockTransport

    tx, rx = EmulatedLink(MockTransport(), gbps=0.1), MockTransport()  # 1 MB at 0.1 Gb/s: 80 ms
    try:
        t0 = time.monotonic()
        handle = tx.send(rx.address, "k", [b'{"layers": []}', b"\x07" * 600_000, b"\x07" * 400_000], 5.0)
        assert handle.wait(5.0) is TransferState.DONE, handle.error
        assert time.monotonic() - t0 >= 0.08 - 0.005  # the link's time for the full size
        got = _recv(rx, "k")
        assert bytes(got[0]) == b'{"layers": []}' and [len(b) for b in got[1:]] == [600_000, 400_000]
        assert not any(got[1]) and tx.stats().bytes_sent < 100  # zeros: only the metadata travelled
        rx.hold("parked", [b"h", b"real"])
        assert rx.recv("parked") == [b"h", b"real"]  # held KV is the real KV
    finally:
        tx.close()
        rx.close()
    with pytest.raises(ValidationError, match=r"needs transport\.emulate"):
        ClusterConfig.load(overrides={"transport.backend": "mock"})


def test_an_emulated_link_is_never_pulled_over(make: Callable[..., Any]) -> None:
    host = "one-host"
    link, peer = EmulatedLink(make("shm", host=host), 1.0), make("shm", host=host)
    assert not link.lends_to(peer.address) and link.pull(peer.address, "k", 1.0) is None
    assert link.lending("k", 10.0).state is TransferState.FAILED
    link.publish("k", [b"parked"])  # held in the endpoint, to be sent over the link
    assert [bytes(b) for b in link.recv("k")] == [b"parked"]
