"""API keys and quotas on the OpenAI HTTP front door (a real uvicorn server over a fake backend)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway_support import FakeFrontDoors, fake_front_doors
from tetriserve.frontdoor.key_table import KeyEntry, KeyTable
from tetriserve.frontdoor.security import FrontDoorSecurity

GOOD = {"authorization": "Bearer sk-good"}
COMPLETION = {"model": "tiny-test", "prompt": [5, 6, 7], "max_tokens": 3}


def secured(metrics_require_key: bool = False, *entries: KeyEntry) -> FrontDoorSecurity:
    table = KeyTable(entries or (KeyEntry.of("sk-good", "good"), KeyEntry.of("sk-other", "other")))
    return FrontDoorSecurity(keys=table, metrics_require_key=metrics_require_key)


@pytest.fixture(scope="module")
def env() -> Iterator[FakeFrontDoors]:
    with fake_front_doors(grpc=False, security=secured()) as doors:
        yield doors


@pytest.fixture()
def http(env: FakeFrontDoors) -> Iterator[httpx.Client]:
    env.backend.reset()
    with httpx.Client(base_url=env.url, timeout=10) as c:
        yield c


def assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["param"] is None and error["message"]
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/models", None), ("POST", "/v1/completions", COMPLETION),
     ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
     ("POST", "/tokenize", {"prompt": "hello"}), ("POST", "/detokenize", {"tokens": [5, 6]}),
     ("GET", "/docs", None), ("GET", "/openapi.json", None), ("GET", "/no-such-route", None)],
)  # fmt: skip
@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer sk-wrong"}, {"authorization": "sk-good"},
                                     {"authorization": "Basic sk-good"}, {"x-api-key": "sk-good"}])  # fmt: skip
def test_missing_or_wrong_key_is_refused(
    env: FakeFrontDoors, http: httpx.Client, method: str, path: str, body: object, headers: dict[str, str]
) -> None:
    assert_401(http.request(method, path, json=body, headers=headers))
    assert env.backend.requests == []  # nothing reached the cluster


def test_the_right_key_is_served(env: FakeFrontDoors, http: httpx.Client) -> None:
    assert http.get("/v1/models", headers=GOOD).json()["data"][0]["id"] == "tiny-test"
    r = http.post("/v1/completions", json=COMPLETION, headers={"authorization": "bearer sk-other"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert http.post("/tokenize", json={"prompt": "hello"}, headers=GOOD).json()["count"] > 0
    with http.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}, headers=GOOD) as s:
        assert s.status_code == 200 and "data: [DONE]" in s.read().decode()


def test_health_ready_and_metrics_stay_open(env: FakeFrontDoors, http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200
    assert http.get("/health", headers={"authorization": "Bearer sk-wrong"}).status_code == 200
    assert http.get("/metrics").status_code != 401  # open by default (404 until the route exists)


def test_metrics_require_key_setting() -> None:
    with fake_front_doors(grpc=False, security=secured(True)) as doors, httpx.Client(base_url=doors.url) as c:
        assert_401(c.get("/metrics"))
        assert c.get("/metrics", headers=GOOD).status_code != 401
        assert c.get("/health").status_code == 200


def test_a_big_unauthenticated_body_is_drained_then_refused(http: httpx.Client) -> None:
    r = http.post("/v1/completions", content=b"x" * (1 << 20), headers={"content-type": "application/json"})
    assert_401(r)


def test_openai_client_with_and_without_key(env: FakeFrontDoors) -> None:
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{env.url}/v1", api_key="sk-good", max_retries=0) as oa:
        assert [m.id for m in oa.models.list()] == ["tiny-test"]
        assert oa.completions.create(model="tiny-test", prompt=[5, 6], max_tokens=2).usage.completion_tokens == 2
    with openai.OpenAI(base_url=f"{env.url}/v1", api_key="sk-wrong", max_retries=0) as oa:
        with pytest.raises(openai.AuthenticationError) as refused:
            oa.models.list()
        assert refused.value.code == "invalid_api_key"


def test_quota_refuses_with_429_and_retry_after() -> None:
    limited = KeyEntry.of("sk-limited", "limited", rate_per_s=0.01, burst=2)
    security = secured(False, KeyEntry.of("sk-good", "good"), limited)
    with fake_front_doors(grpc=False, security=security) as doors, httpx.Client(base_url=doors.url) as c:
        key = {"authorization": "Bearer sk-limited"}
        assert [c.post("/v1/completions", json=COMPLETION, headers=key).status_code for _ in range(2)] == [200, 200]
        r = c.post("/v1/completions", json=COMPLETION, headers=key)
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "limited" in error["message"] and "sk-limited" not in error["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 100
        assert c.post("/v1/completions", json=COMPLETION, headers=GOOD).status_code == 200  # other keys unaffected
        assert c.get("/health").status_code == 200  # no quota on the open routes
        assert len(doors.backend.requests) == 3
