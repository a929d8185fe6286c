"""The Flip and Scale admin RPCs end to end over gRPC (gateway + SDK + CLI) against a simulated cluster."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("grpc")

from tests.fakes import FakeBackend
from tests.gateway_support import FakeFrontDoors, backend, client, env
from tetriserve.cli.main import main
from tetriserve.client import AsyncTetriServeClient, FailedPrecondition, InvalidArgument, NotFound, TetriServeClient

__all__ = ["backend", "client", "env"]  # fixtures


def test_scale_then_flip_through_the_sdk_and_status_shows_the_roles(
    backend: FakeBackend, client: TetriServeClient
) -> None:
    assert client.scale(decode=2) == ["adding decode-1"]
    with pytest.raises(FailedPrecondition, match="decode-1 is busy: add decode-1 is under way"):
        client.flip("decode-1", "prefill")
    client.cluster_status()  # the controller ticks: decode-1 serves
    assert client.flip("decode-1", "prefill") == "draining decode-1 to flip it to prefill"
    by_id = {w.worker_id: w for w in client.cluster_status().workers}
    assert (by_id["decode-1"].lifecycle, by_id["decode-1"].role) == ("draining", "decode")
    deadline = time.monotonic() + 10
    while by_id["decode-1"].role != "prefill" or by_id["decode-1"].lifecycle != "active":
        assert time.monotonic() < deadline, by_id  # the drain settles after a second; status ticks the controller
        time.sleep(0.1)
        by_id = {w.worker_id: w for w in client.cluster_status().workers}
    flipped = by_id["decode-1"]
    assert flipped.flips == 1 and flipped.incarnation == 0 and flipped.last_flip_switch_ms is not None
    assert [c[0] for c in backend.cluster.calls] == ["add", "drain", "flip"]


def test_refusals_come_back_in_grpc_shape(backend: FakeBackend, client: TetriServeClient) -> None:
    with pytest.raises(NotFound, match="unknown worker 'decode-7'"):
        client.flip("decode-7", "prefill")
    with pytest.raises(InvalidArgument) as bad:
        client.flip("decode-0", "verifier")
    assert bad.value.field == "role"
    with pytest.raises(FailedPrecondition, match="at least 1 decode worker"):
        client.flip("decode-0", "prefill")  # the only decode worker
    with pytest.raises(FailedPrecondition, match="--prefill 0"):
        client.scale(prefill=0)
    assert client.scale(prefill=1, decode=1) == ["nothing to do: the counts are already so"]


def test_async_client_flip_and_scale(env: FakeFrontDoors, backend: FakeBackend) -> None:
    async def go() -> tuple[list[str], str]:
        async with AsyncTetriServeClient(env.target, timeout=10) as c:
            added = await c.scale(prefill=2)
            await c.cluster_status()
            return added, await c.flip("prefill-1", "decode")

    added, flipping = asyncio.run(go())
    assert added == ["adding prefill-1"]
    assert flipping == "draining prefill-1 to flip it to decode"


def test_cli_scale_and_flip_wait_until_done(
    backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scale", "--decode", "2", "--target", env.target, "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "adding decode-1" in out and "serving: 1 prefill, 2 decode" in out
    assert main(["flip", "decode-1", "prefill", "--target", env.target, "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "draining decode-1 to flip it to prefill" in out and "decode-1 serves prefill now (flip 1)" in out
    assert main(["status", "--target", env.target]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("decode-1"))
    assert row.split()[1] == "prefill" and row.split()[5] == "1"  # role, flips
    assert main(["flip", "decode-0", "prefill", "--target", env.target]) == 1
    assert "FAILED_PRECONDITION" in capsys.readouterr().err
    assert main(["scale", "--target", env.target]) == 2  # nothing asked
