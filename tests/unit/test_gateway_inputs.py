"""Inputs the HTTP front door must refuse in OpenAI's error shape rather than fail on: integers the engines and
the wire cannot carry, text that is not valid Unicode, a prompt far longer than the context (refused from its
head, without tokenizing it all), a request id already in flight (HTTP makes it unique, gRPC refuses it; neither
touches the request in flight), and a bug anywhere behind a route (500 in the same shape, not plain text)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.fakes import FakeBackend, wait_until
from tests.gateway_support import FakeFrontDoors, backend, env, error_of, http
from tetriserve.client import InvalidArgument, TetriServeClient
from tetriserve.common.errors import InvalidRequestError
from tetriserve.common.request import Request
from tetriserve.common.stream import StreamChunk
from tetriserve.frontdoor.field_checks import (
    HEAD_MARGIN_TOKENS,
    PRIORITY_RANGE,
    SEED_RANGE,
    check_head,
    int_value,
    unicode_text,
)

SURROGATE = '"a\\ud800b"'  # JSON for a string holding a lone surrogate


__all__ = ["backend", "env", "http"]  # fixtures


def complete(http: httpx.Client, **fields: Any) -> httpx.Response:
    return http.post("/v1/completions", json={"model": "tiny-test", "prompt": "hi", "max_tokens": 2, **fields})


def raw_post(http: httpx.Client, path: str, body: str) -> httpx.Response:
    return http.post(path, content=body.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("seed", [SEED_RANGE[0], -3, 0, SEED_RANGE[1]])
def test_seeds_of_64_bits_are_served(http: httpx.Client, backend: FakeBackend, seed: int) -> None:
    assert complete(http, seed=seed).status_code == 200


@pytest.mark.parametrize("seed", [SEED_RANGE[1] + 1, 2**70, SEED_RANGE[0] - 1])
def test_a_seed_beyond_64_bits_is_a_400_naming_it(http: httpx.Client, seed: int) -> None:
    err = error_of(complete(http, seed=seed), 400)
    assert err["param"] == "seed" and err["type"] == "invalid_request_error" and str(seed) in err["message"]


def test_a_priority_beyond_32_bits_is_a_400_naming_it(http: httpx.Client) -> None:
    assert error_of(complete(http, priority=2**40), 400)["param"] == "priority"
    assert complete(http, priority=PRIORITY_RANGE[1]).status_code == 200


def test_a_top_k_that_keeps_the_whole_vocabulary_is_no_top_k(http: httpx.Client, backend: FakeBackend) -> None:
    for asked, sent in [(5, 5), (2**70, 0), (-1, 0)]:
        assert complete(http, top_k=asked).status_code == 200
        assert backend.requests[-1].sampling.top_k == sent


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", '{"model": "tiny-test", "max_tokens": 2, "prompt": %s}', "prompt"),
        ("/v1/completions", '{"model": "tiny-test", "max_tokens": 2, "prompt": "hi", "stop": [%s]}', "stop"),
        (
            "/v1/chat/completions",
            '{"model": "tiny-test", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}',
            "messages",
        ),
        ("/tokenize", '{"model": "tiny-test", "prompt": %s}', "prompt"),
    ],
)
def test_text_with_a_lone_surrogate_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: str, param: str
) -> None:
    err = error_of(raw_post(http, path, body % SURROGATE), 400)
    assert err["param"] == param and "not valid Unicode" in err["message"]
    assert complete(http).status_code == 200  # and the front door serves on


def test_a_prompt_far_past_the_context_is_refused_from_its_head(http: httpx.Client) -> None:
    err = error_of(complete(http, prompt="hello world " * 100_000), 400)
    assert err["param"] == "prompt" and "far longer than the context" in err["message"]
    err = error_of(complete(http, prompt="hello world " * 40), 400)  # past it, not far: counted whole
    assert err["param"] == "prompt" and "leaves no room to generate" in err["message"]


def test_two_http_requests_with_one_x_request_id_are_both_served(
    http: httpx.Client, backend: FakeBackend, env: FakeFrontDoors
) -> None:
    backend.behavior.token_delay_s = 0.02  # the first is still streaming when the second comes

    def ask(prompt: list[int]) -> httpx.Response:
        body = {"model": "tiny-test", "prompt": prompt, "max_tokens": 12, "ignore_eos": True}
        return http.post("/v1/completions", json=body, headers={"x-request-id": "dup"})

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, [5, 6])
        wait_until(lambda: "dup" in env.front.live_ids, what="the first request streaming")
        second = pool.submit(ask, [7, 8])
        responses = [first.result(), second.result()]
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    ids = [r.headers["x-request-id"] for r in responses]
    assert ids[0] == "dup" and ids[1].startswith("dup-") and len(ids[1]) == len("dup-") + 8
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [12, 12]
    assert backend.abort_calls == []  # neither touched the other


def test_a_grpc_request_id_in_flight_is_refused_without_touching_the_first(
    backend: FakeBackend, env: FakeFrontDoors
) -> None:
    backend.behavior.token_delay_s = 0.02
    with TetriServeClient(env.target, timeout=10) as client:
        first = client.generate([5, 6], max_tokens=12, ignore_eos=True, request_id="grpc-dup")
        assert next(first).token_ids == (5,)
        with pytest.raises(InvalidArgument) as caught:
            list(client.generate([7, 8], max_tokens=4, request_id="grpc-dup"))
        assert caught.value.field == "request_id" and "already in flight" in str(caught.value)
        rest = list(first)
    assert rest[-1].finish_reason == "length" and backend.abort_calls == []


def test_a_bug_behind_a_route_is_a_500_in_openai_shape(
    http: httpx.Client, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(request: Request) -> AsyncIterator[StreamChunk]:
        raise RuntimeError("a bug")
        yield  # pragma: no cover  (an async generator)

    monkeypatch.setattr(backend, "generate", broken)
    err = error_of(complete(http), 500)
    assert err["type"] == "server_error" and err["code"] == "internal_error" and "a bug" not in err["message"]


# ---- the checks themselves -------------------------------------------------------------------------------


def test_int_value_passes_none_and_the_range_and_names_the_field_outside_it() -> None:
    assert int_value("seed", None, *SEED_RANGE) is None
    assert int_value("seed", SEED_RANGE[1], *SEED_RANGE) == SEED_RANGE[1]
    with pytest.raises(InvalidRequestError) as caught:
        int_value("priority", PRIORITY_RANGE[0] - 1, *PRIORITY_RANGE)
    assert caught.value.field == "priority"


def test_unicode_text_names_where_the_surrogate_is() -> None:
    assert unicode_text("prompt", "héllo ✓") == "héllo ✓"
    with pytest.raises(InvalidRequestError, match="at character 3"):
        unicode_text("prompt", "abc\ud800")


def test_check_head_tokenizes_only_the_head_of_a_long_text() -> None:
    calls: list[int] = []

    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        calls.append(len(text))
        return [0] * len(text)  # one token a character

    check_head("prompt", "x" * 100, encode, max_model_len=64, max_token_chars=1)  # short: not tokenized here
    assert calls == []
    with pytest.raises(InvalidRequestError, match="far longer"):
        check_head("prompt", "x" * 10**6, encode, max_model_len=64, max_token_chars=1)
    assert calls == [64 + HEAD_MARGIN_TOKENS]


def test_check_head_leaves_a_text_that_folds_into_few_tokens_to_the_caller() -> None:
    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        return [0]  # a tokenizer that folds any run into one token

    check_head("prompt", " " * 10**6, encode, max_model_len=64, max_token_chars=1)  # no refusal
