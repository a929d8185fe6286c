"""The default backend where the cluster spans hosts: shared memory to a peer on this host, UCX to
one on another, TCP to one that has no UCX listener; what lands either way is in the one store ``recv`` reads.

Two endpoints on this machine play two hosts by carrying different host ids (``host=``). The contract suite
(``test_transport_contract.py``) runs against such pairs too (kind ``auto``), so every transfer there crosses
"hosts" over UCX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.transport_support import recv_within as _recv
from tetriserve.transport.api import TransferState
from tetriserve.transport.auto import ucx_port
from tetriserve.transport.registry import backend_of, make_transport
from tetriserve.transport.shm import ShmTransport, host_id, split_address


def _send(tx: Any, dst: str, key: str, payload: bytes) -> None:
    handle = tx.send(dst, key, [payload], 10.0)
    assert handle.wait(10.0) is TransferState.DONE, handle.error


def test_a_peer_on_another_host_gets_the_bytes_over_ucx(make: Callable[..., Any]) -> None:
    tx, rx = make("auto", host="host-a"), make("auto", host="host-b")
    assert rx.address.startswith("shm://host-b@127.0.0.1:") and ucx_port(rx.address)
    assert tx.route(rx.address) == "ucx"
    _send(tx, rx.address, "k", b"over ucx" * 1000)
    assert bytes(_recv(rx, "k")[0]) == b"over ucx" * 1000
    assert tx.stats().transfers_sent == 1 and rx.stats().transfers_received == 1
    assert tx.stats().bytes_sent == rx.stats().bytes_received == 8000


def test_a_peer_on_this_host_gets_them_through_shared_memory(make: Callable[..., Any]) -> None:
    tx, rx = make("auto", host="host-a"), make("auto", host="host-a")
    assert tx.route(rx.address) == "shm"
    _send(tx, rx.address, "k", b"x" * 300_000)
    got = _recv(rx, "k")
    assert isinstance(got[0], memoryview) and bytes(got[0]) == b"x" * 300_000  # a view of the sender's slab


def test_endpoints_without_ucx_still_talk_to_it_both_ways(make: Callable[..., Any]) -> None:
    """A worker that opened a plain shm endpoint (while its cluster was on one host) and one that opened an
    ``auto`` endpoint after the cluster spanned hosts."""
    auto, plain = make("auto", host="host-a"), make("shm")
    assert auto.route(plain.address) == "tcp"  # another host, no UCX listener there: inline over TCP
    _send(auto, plain.address, "to-plain", b"a")
    _send(plain, auto.address, "to-auto", b"b")  # the shm endpoint reads the address's shm part
    assert bytes(_recv(plain, "to-plain")[0]) == b"a" and bytes(_recv(auto, "to-auto")[0]) == b"b"


def test_the_registry_opens_ucx_only_for_a_cluster_that_spans_hosts() -> None:
    one_host = make_transport("auto", "127.0.0.1:0")
    spanning = make_transport("auto", "127.0.0.1:0", across_hosts=True)
    try:
        assert isinstance(one_host, ShmTransport) and ucx_port(one_host.address) is None
        assert backend_of(one_host.address) == "shm" and backend_of(spanning.address) == "shm+ucx"
        hid, hostport = split_address(spanning.address)
        assert hid == host_id() and hostport.startswith("127.0.0.1:") and "?" not in hostport
    finally:
        one_host.close()
        spanning.close()


def test_a_worker_sees_its_cluster_span_hosts_by_the_live_ray_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from tetriserve.engine.worker_base import cluster_spans_hosts

    assert not cluster_spans_hosts()  # outside Ray: one host
    nodes = [{"Alive": True, "NodeManagerAddress": "10.0.0.1"}, {"Alive": False, "NodeManagerAddress": "10.0.0.2"}]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.1")
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert not cluster_spans_hosts()  # the other node is dead
    nodes.append({"Alive": True, "NodeManagerAddress": "10.0.0.3"})
    assert cluster_spans_hosts()
