"""TLS on both front doors (a self-signed certificate made in the test) with API keys: the SDK verifies the
server, HTTPS clients verify it too, and a plaintext or unverified client is refused."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway_support import FakeFrontDoors, fake_front_doors
from tests.tls_support import SelfSigned, self_signed
from tetriserve.cli.main import main as cli_main
from tetriserve.client import NO_RETRY, AsyncTetriServeClient, TetriServeClient, Unauthenticated, Unavailable
from tetriserve.client.credentials import API_KEY_ENV
from tetriserve.frontdoor.key_table import KeyEntry, KeyTable
from tetriserve.frontdoor.security import FrontDoorSecurity, TlsFiles


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def env(cert: SelfSigned) -> Iterator[FakeFrontDoors]:
    security = FrontDoorSecurity(keys=KeyTable([KeyEntry.of("sk-good", "good")]), tls=TlsFiles.of(cert.cert, cert.key))
    with fake_front_doors(security=security) as doors:
        yield doors


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def port(env: FakeFrontDoors) -> str:
    return env.target.rsplit(":", 1)[1]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_sdk_verifies_the_server_and_sends_its_key(env: FakeFrontDoors, cert: SelfSigned, host: str) -> None:
    target = f"{host}:{port(env)}"
    for roots in (str(cert.cert), cert.cert, cert.cert_pem, cert.cert_pem.decode()):
        with TetriServeClient(target, retry=NO_RETRY, timeout=10, api_key="sk-good", root_certificates=roots) as c:
            assert c.complete([5, 6, 7], max_tokens=3).token_ids == (5, 6, 7)
    with TetriServeClient(target, retry=NO_RETRY, timeout=10, root_certificates=cert.cert) as c:
        assert c.health().serving  # TLS without a key: health only
        with pytest.raises(Unauthenticated):
            c.cluster_status()


def test_async_sdk_over_tls(env: FakeFrontDoors, cert: SelfSigned) -> None:
    async def run() -> None:
        target = f"localhost:{port(env)}"
        async with AsyncTetriServeClient(
            target, retry=NO_RETRY, timeout=10, api_key="sk-good", root_certificates=cert.cert_pem
        ) as client:
            assert (await client.complete([5, 6], max_tokens=2)).token_ids == (5, 6)

    asyncio.run(run())


def test_plaintext_or_unverified_clients_are_refused(env: FakeFrontDoors, tmp_path: Path) -> None:
    stranger = self_signed(tmp_path)  # another self-signed certificate for the same names
    clients = {
        "plaintext": {"api_key": "sk-good"},
        "system roots": {"api_key": "sk-good", "tls": True},  # a self-signed certificate is not under them
        "another CA": {"root_certificates": stranger.cert},
    }
    for kwargs in clients.values():
        client = TetriServeClient(env.target, retry=NO_RETRY, timeout=5, **kwargs)  # type: ignore[arg-type]
        with client, pytest.raises(Unavailable):
            client.health()


def test_sdk_argument_checks(cert: SelfSigned, tmp_path: Path) -> None:
    import grpc

    with pytest.raises(ValueError, match="root_certificates: cannot read"):
        TetriServeClient("localhost:1", root_certificates=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="not both"):
        TetriServeClient("localhost:1", credentials=grpc.ssl_channel_credentials(), tls=True)
    with pytest.raises(ValueError, match="api_key"):
        TetriServeClient("localhost:1", api_key="two words")


def test_https_front_door(env: FakeFrontDoors, cert: SelfSigned) -> None:
    assert env.url.startswith("https://")
    key = {"authorization": "Bearer sk-good"}
    with httpx.Client(base_url=env.url, verify=ssl.create_default_context(cafile=str(cert.cert)), timeout=10) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").status_code == 401
        r = c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, headers=key)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    with httpx.Client(base_url=env.url, timeout=10) as unverified, pytest.raises(httpx.ConnectError):
        unverified.get("/health")
    plain = env.url.replace("https://", "http://")
    with httpx.Client(base_url=plain, timeout=10) as c, pytest.raises(httpx.HTTPError):
        c.get("/health")


def test_cli_over_tls(env: FakeFrontDoors, cert: SelfSigned, capsys: pytest.CaptureFixture[str]) -> None:
    target = f"localhost:{port(env)}"
    args = ["--target", target, "--api-key", "sk-good", "--tls-ca", str(cert.cert)]
    assert cli_main(["status", *args, "--json"]) == 0
    assert '"model": "tiny-test"' in capsys.readouterr().out
    assert cli_main(["generate", "hello", "--max-tokens", "2", *args]) == 0
    assert cli_main(["status", "--target", target, "--api-key", "sk-good"]) == 1  # plaintext to a TLS port


def test_tls_without_keys_is_tls_only(cert: SelfSigned) -> None:
    security = FrontDoorSecurity(tls=TlsFiles.of(cert.cert, cert.key))
    with fake_front_doors(security=security) as doors:
        target = f"localhost:{doors.target.rsplit(':', 1)[1]}"
        with TetriServeClient(target, retry=NO_RETRY, timeout=10, root_certificates=cert.cert) as c:
            assert c.cluster_status().model == "tiny-test"


def test_serve_runs_both_doors_with_the_config_security(
    cert: SelfSigned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve`'s wiring (``run_front_doors``): keys from the config, a keys file and the environment; TLS."""
    from concurrent.futures import Future

    from tests.fakes import FakeBackend, LoopThread, tokenizer_dir
    from tetriserve.cli.serve import Endpoints, run_front_doors
    from tetriserve.common.config import ClusterConfig

    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-file rate=1/h burst=1 name=file\n")
    monkeypatch.setenv(API_KEY_ENV, "sk-env")
    security = {"api_keys": ["sk-cfg"], "api_keys_file": str(keys_file), "tls_cert": str(cert.cert),
                "tls_key": str(cert.key)}  # fmt: skip
    config = ClusterConfig.model_validate({"grpc_port": 0, "http_port": 0, "drain_grace_s": 0, "security": security})
    loop, stop, ready = LoopThread(), asyncio.Event(), Future[Endpoints]()

    async def serve() -> None:
        endpoints: asyncio.Future[Endpoints] = asyncio.get_running_loop().create_future()
        endpoints.add_done_callback(lambda f: ready.set_result(f.result()))
        backend = FakeBackend(tokenizer_dir())
        await run_front_doors(config, backend, backend, stop, endpoints)

    served = asyncio.run_coroutine_threadsafe(serve(), loop.loop)
    try:
        ep = ready.result(timeout=60)
        assert ep.http.startswith("https://127.0.0.1:") and ep.tls
        assert ep.security == "API key required (3 keys, 1 with a quota); TLS on"
        target = f"localhost:{ep.grpc.rsplit(':', 1)[1]}"
        for key in ("sk-cfg", "sk-file", "sk-env"):
            with TetriServeClient(target, retry=NO_RETRY, timeout=10, api_key=key, root_certificates=cert.cert) as c:
                assert c.complete([5], max_tokens=1).token_ids == (5,)
        keyless = TetriServeClient(target, retry=NO_RETRY, timeout=10, api_key="", root_certificates=cert.cert)
        with keyless, pytest.raises(Unauthenticated):
            keyless.complete([5], max_tokens=1)
        verify = ssl.create_default_context(cafile=str(cert.cert))
        with httpx.Client(base_url=ep.http, verify=verify, timeout=10) as http:
            assert http.get("/v1/models", headers={"authorization": "Bearer sk-file"}).status_code == 429  # quota
            assert http.get("/v1/models", headers={"authorization": "Bearer sk-env"}).status_code == 200
            assert http.get("/ready").status_code == 200
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        served.result(timeout=30)
        loop.stop()
