"""ucx and nccl specifics: addresses, the config and registry naming them, the UCX environment defaults, the
nccl watchdog. The contract itself runs against both in test_transport_contract.py and test_transport_peers.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.transport_support import poll
from tetriserve.common.config import ClusterConfig
from tetriserve.transport.api import TransferState
from tetriserve.transport.registry import backend_of, make_transport


@pytest.mark.parametrize("kind", ["ucx", "nccl"])
def test_the_config_and_registry_name_the_backend(kind: str) -> None:
    cfg = ClusterConfig.load(overrides={"transport.backend": kind})
    assert cfg.transport.backend == kind
    endpoint = make_transport(kind, "127.0.0.1:0")
    try:
        assert endpoint.address.startswith(f"{kind}://127.0.0.1:")
        assert backend_of(endpoint.address) == kind  # what status shows per worker
    finally:
        endpoint.close()


def test_ucx_sets_its_cpu_defaults_before_ucxx_loads(make: Callable[..., Any]) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU host: UCX keeps its own rendezvous memory type")
    make("ucx")
    assert os.environ["UCX_RNDV_FRAG_MEM_TYPE"] == "host"


def test_ucx_progresses_on_the_transport_loop_not_on_a_thread_of_its_own(make: Callable[..., Any]) -> None:
    # ucxx's default ("thread") runs a C++ progress thread that calls into Python; ucxx does not vouch for it in
    # processes with several Python threads (transport/ucx.py, UCX_DEFAULTS)
    tx, rx = make("ucx"), make("ucx")
    assert tx.send(rx.address, "k", [b"x" * 100_000], 5.0).wait(5.0) is TransferState.DONE
    import ucxx.core

    assert ucxx.core._get_ctx().progress_mode == "blocking"


def test_an_idle_ucx_transport_leaves_the_cores_alone(make: Callable[..., Any]) -> None:
    # ucxx's blocking mode spins on an event descriptor it never re-arms, and ucxx polls a posted receive without a
    # pause: unguarded, one idle pooled endpoint keeps a core busy (5.00 s of CPU in 5 s, against 0.32 s with
    # transport/ucx.py's re-arming and probing: `python benchmarks/diagnostics/ucx_idle_cpu.py --variant
    # blocking=98af462 --variant final=`)
    tx, rx = make("ucx"), make("ucx")
    assert tx.send(rx.address, "k", [b"x" * 100_000], 5.0).wait(5.0) is TransferState.DONE  # an endpoint in the pool
    time.sleep(0.2)
    cpu = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - cpu < 0.25  # the process's CPU, every thread's; 0.32 s in 5 s there
    assert tx.send(rx.address, "k2", [b"y" * 100_000], 5.0).wait(5.0) is TransferState.DONE  # and it still serves


@pytest.mark.parametrize("kind", ["ucx", "nccl"])
def test_a_send_to_nobody_fails_within_its_deadline(make: Callable[..., Any], kind: str, dead_port: str) -> None:
    handle = make(kind).send(f"{kind}://{dead_port}", "k", [b"x"], deadline_s=2.0)
    assert handle.wait(10.0) is TransferState.FAILED
    assert handle.finished is not None and handle.finished - handle.started <= 3.0
    assert handle.error is not None and "k" in handle.error


def test_nccl_is_gloo_without_cuda() -> None:
    import torch

    endpoint = make_transport("nccl", "127.0.0.1:0")
    try:
        assert endpoint.backend == ("nccl" if torch.cuda.is_available() else "gloo")  # type: ignore[attr-defined]
    finally:
        endpoint.close()
    with pytest.raises(ValueError, match="backend"):
        make_transport("nccl", "127.0.0.1:0", backend="mpi")


def test_the_nccl_watchdog_fires_past_the_deadline_only() -> None:
    from tetriserve.transport.watchdog import Watchdog

    dog, fired = Watchdog(), threading.Event()
    try:
        with dog.watch(time.monotonic() + 60.0, fired.set):
            pass  # finished in time: never fires
        with dog.watch(time.monotonic() + 0.05, fired.set):
            poll(fired.is_set, 5.0, "the watchdog to fire")
    finally:
        dog.close()


def test_nccl_rebuilds_a_torn_down_pair_on_next_use(make: Callable[..., Any]) -> None:
    tx, rx = make("nccl"), make("nccl")
    assert tx.send(rx.address, "a", [b"1" * 100], 10.0).wait(10.0) is TransferState.DONE
    first = tx._pairs[rx.address]
    first.tear_down()  # as the watchdog does to a pair whose transfer hung
    again = tx.send(rx.address, "c", [b"3" * 100], 10.0)
    assert again.wait(10.0) is TransferState.DONE, again.error
    assert tx._pairs[rx.address] is not first
    assert bytes(poll(lambda: rx.recv("c"))[0]) == b"3" * 100
