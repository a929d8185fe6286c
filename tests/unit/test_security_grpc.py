"""API keys and quotas on the gRPC front door (the interceptor on a real in-process server, a fake backend),
through the SDK (sync and async), a bare stub and the CLI."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest

from tests.gateway_support import FakeFrontDoors, fake_front_doors
from tetriserve.cli.main import main as cli_main
from tetriserve.client import NO_RETRY, AsyncTetriServeClient, ResourceExhausted, TetriServeClient, Unauthenticated
from tetriserve.client.credentials import API_KEY_ENV
from tetriserve.frontdoor.key_table import KeyEntry, KeyTable
from tetriserve.frontdoor.security import FrontDoorSecurity
from tetriserve.protos import tetriserve_pb2 as pb
from tetriserve.protos import tetriserve_pb2_grpc as pb_grpc

KEYS = (KeyEntry.of("sk-good", "good"), KeyEntry.of("sk-admin", "admin"))


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture(scope="module")
def env() -> Iterator[FakeFrontDoors]:
    with fake_front_doors(http=False, security=FrontDoorSecurity(keys=KeyTable(KEYS))) as doors:
        yield doors


def client_for(env: FakeFrontDoors, api_key: str | None) -> TetriServeClient:
    env.backend.reset()
    return TetriServeClient(env.target, retry=NO_RETRY, timeout=10, api_key=api_key)


CALLS: dict[str, Callable[[TetriServeClient], Any]] = {
    "generate": lambda c: list(c.generate([5, 6], max_tokens=2)),
    "complete": lambda c: c.complete("hello", max_tokens=2),
    "abort": lambda c: c.abort("r-1"),
    "cluster_status": lambda c: c.cluster_status(),
    "set_policy": lambda c: c.set_policy({"queue": "sjf"}),
    "flip": lambda c: c.flip("decode-0", "prefill"),
    "scale": lambda c: c.scale(prefill=2),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("api_key", [None, "", "sk-wrong", "sk-good-but-longer"])
def test_missing_or_wrong_key_is_unauthenticated(env: FakeFrontDoors, call: str, api_key: str | None) -> None:
    with client_for(env, api_key) as client, pytest.raises(Unauthenticated) as refused:
        CALLS[call](client)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "sk-" not in refused.value.details
    assert env.backend.requests == [] and env.backend.abort_calls == [] and env.backend.policy_changes == []


def test_the_right_key_is_served(env: FakeFrontDoors) -> None:
    with client_for(env, "sk-good") as client:
        assert client.complete([5, 6, 7], max_tokens=3).token_ids == (5, 6, 7)
        assert client.cluster_status().model == "tiny-test"
        assert client.abort("no-such-request") is False
    with client_for(env, "sk-admin") as admin:
        assert admin.set_policy({"queue": "sjf"}).workers[0].policy["queue"] == "sjf"


def test_health_stays_open(env: FakeFrontDoors) -> None:
    for key in (None, "sk-wrong"):
        with client_for(env, key) as client:
            assert client.health().serving


def test_key_from_the_environment(env: FakeFrontDoors, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "sk-good,sk-other")  # a client sends the first key of a list
    with client_for(env, None) as client:
        assert client.complete([5], max_tokens=1).token_ids == (5,)
    with client_for(env, "") as client, pytest.raises(Unauthenticated):  # "" sends no key whatever the env says
        client.complete([5], max_tokens=1)


def test_bare_stub_with_metadata(env: FakeFrontDoors) -> None:
    with grpc.insecure_channel(env.target) as channel:
        stub = pb_grpc.TetriServeStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=10, metadata=(("authorization", "Bearer nope"),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "Incorrect API key provided."
        ok = stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=10, metadata=(("authorization", "Bearer sk-good"),))
        assert ok.model == "tiny-test"
        assert stub.Health(pb.HealthRequest(), timeout=10).serving


def test_async_client(env: FakeFrontDoors) -> None:
    async def run() -> None:
        async with AsyncTetriServeClient(env.target, retry=NO_RETRY, timeout=10, api_key="sk-good") as client:
            assert (await client.complete([5, 6], max_tokens=2)).token_ids == (5, 6)
            chunks = [c async for c in client.generate([5, 6], max_tokens=2)]
            assert chunks[-1].finish_reason == "length"
        async with AsyncTetriServeClient(env.target, retry=NO_RETRY, timeout=10) as client:
            with pytest.raises(Unauthenticated):
                await client.complete([5, 6], max_tokens=2)
            with pytest.raises(Unauthenticated):
                await client.set_policy({"queue": "sjf"})
            assert (await client.health()).serving

    asyncio.run(run())


def test_cli_takes_a_key(
    env: FakeFrontDoors, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli_main(["status", "--target", env.target, "--json", "--api-key", "sk-good"]) == 0
    assert '"model": "tiny-test"' in capsys.readouterr().out
    assert cli_main(["policy", "show", "--target", env.target]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    monkeypatch.setenv(API_KEY_ENV, "sk-admin")
    assert cli_main(["policy", "set", "--target", env.target, "queue=sjf"]) == 0
    assert cli_main(["generate", "hi there", "--target", env.target, "--max-tokens", "2"]) == 0
    assert cli_main(["flip", "decode-0", "prefill", "--target", env.target, "--api-key", "sk-x", "--no-wait"]) == 1


# ---- quotas -----------------------------------------------------------------------------------------


def test_quota_is_resource_exhausted_with_retry_after_and_shared_by_both_doors() -> None:
    limited = KeyEntry.of("sk-limited", "limited", rate_per_s=0.01, burst=3)
    security = FrontDoorSecurity(keys=KeyTable((*KEYS, limited)))
    with fake_front_doors(security=security) as doors:
        with TetriServeClient(doors.target, retry=NO_RETRY, timeout=10, api_key="sk-limited") as client:
            assert client.complete([5], max_tokens=1).token_ids == (5,)
            assert client.cluster_status().model == "tiny-test"
            with httpx.Client(base_url=doors.url) as http:  # the third token of the bucket, over HTTP
                assert http.get("/v1/models", headers={"authorization": "Bearer sk-limited"}).status_code == 200
                assert http.get("/v1/models", headers={"authorization": "Bearer sk-limited"}).status_code == 429
            with pytest.raises(ResourceExhausted) as refused:
                list(client.generate([5], max_tokens=1))
            assert refused.value.retry_after_s is not None and 1 <= refused.value.retry_after_s <= 100
            assert "limited" in refused.value.details
            assert client.health().serving  # Health takes no token
        with TetriServeClient(doors.target, retry=NO_RETRY, timeout=10, api_key="sk-good") as other:
            assert other.complete([5], max_tokens=1).token_ids == (5,)
