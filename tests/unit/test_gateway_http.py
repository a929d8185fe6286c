"""The OpenAI-compatible HTTP gateway on a real uvicorn server, driven by httpx and the openai client."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes import FakeBackend, wait_until
from tests.gateway_support import FakeFrontDoors, backend, env, http, sse_events

__all__ = ["backend", "env", "http"]  # fixtures

MULTIBYTE = "日本語 🚀 ĳ ok"


def n_tokens(env: FakeFrontDoors, text: str) -> int:
    return len(env.front.tokenize(text))


# ---- happy paths ---------------------------------------------------------------------------------


def test_models_and_health(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client) -> None:
    card = http.get("/v1/models").json()["data"][0]
    assert (card["id"], card["root"], card["max_model_len"]) == ("tiny-test", env.backend.model_path, 64)
    assert http.get("/health").status_code == 200
    backend.behavior.healthy = False
    assert http.get("/health").status_code == 503


def test_completion_non_streaming_with_usage(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client) -> None:
    n = n_tokens(env, MULTIBYTE)
    r = http.post("/v1/completions", json={"model": "tiny-test", "prompt": MULTIBYTE, "max_tokens": n})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == MULTIBYTE and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": n, "total_tokens": 2 * n}


@pytest.mark.parametrize("prompt", [[MULTIBYTE], "ids", "nested-ids"])
def test_completion_prompt_forms(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client, prompt: Any) -> None:
    ids = list(env.front.tokenize(MULTIBYTE))
    prompt = {"ids": ids, "nested-ids": [ids]}.get(prompt, prompt) if isinstance(prompt, str) else prompt
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": len(ids)})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == MULTIBYTE


def test_completion_default_max_tokens_is_16(backend: FakeBackend, http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": [5, 6]})
    assert r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("include_usage", [True, False])
def test_completion_streaming(
    env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client, include_usage: bool
) -> None:
    n = n_tokens(env, MULTIBYTE)
    body = {"prompt": MULTIBYTE, "max_tokens": n, "stream": True, "stream_options": {"include_usage": include_usage}}
    with http.stream("POST", "/v1/completions", json=body, headers={"x-request-id": "http-1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"] == "http-1"
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert len(chunks) == n and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("\ufffd" not in c["choices"][0]["text"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == MULTIBYTE
    usage_events = [e for e in events[:-1] if not e["choices"]]
    if include_usage:
        assert [e["usage"] for e in usage_events] == [
            {"prompt_tokens": n, "completion_tokens": n, "total_tokens": 2 * n}
        ]
    else:
        assert usage_events == [] and "usage" not in chunks[0]
    assert backend.requests[0].request_id == "http-1"


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(backend: FakeBackend, http: httpx.Client) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": "hello world", "max_tokens": 3, "stream": True, "stream_options": options}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r)[:-1]
    prompt = len(backend.requests[0].prompt_token_ids)
    assert [e["usage"]["completion_tokens"] for e in events if e["choices"]] == [1, 2, 3]
    assert events[-1]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}


@pytest.mark.parametrize("stream", [True, False])
def test_stop_string_ends_the_text_before_it_and_aborts_the_workers(
    env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client, stream: bool
) -> None:
    # the fake echoes the prompt's tokens: the stop string spans several of them and starts mid-token
    n = n_tokens(env, MULTIBYTE)
    body = {"prompt": MULTIBYTE, "max_tokens": n, "stream": stream, "stop": ["xyz", "🚀 ĳ"], "min_tokens": 1}
    if stream:
        with http.stream("POST", "/v1/completions", json=body) as r:
            events = sse_events(r)[:-1]
        text = "".join(e["choices"][0]["text"] for e in events)
        finish = events[-1]["choices"][0]["finish_reason"]
    else:
        choice = http.post("/v1/completions", json=body).json()["choices"][0]
        text, finish = choice["text"], choice["finish_reason"]
    assert (text, finish) == ("日本語 ", "stop")
    assert backend.requests[-1].sampling.stop == ("xyz", "🚀 ĳ") and backend.requests[-1].sampling.min_tokens == 1
    assert backend.abort_calls == [backend.requests[-1].request_id]


def test_chat_completion(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    expected = env.front.chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert backend.requests[0].prompt_token_ids == expected
    assert body["usage"]["prompt_tokens"] == len(expected) and body["usage"]["completion_tokens"] == 4
    stream_body = {"messages": messages, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=stream_body) as r:
        events = sse_events(r)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and len(deltas) == 1 + 3  # the role first, as vLLM
    assert events[-2]["usage"]["completion_tokens"] == 3 and events[-1] == "[DONE]"


def test_chat_default_max_tokens_uses_context_left(backend: FakeBackend, http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 64


# ---- errors --------------------------------------------------------------------------------------

HI = {"role": "user", "content": "hi"}
IMAGE_MESSAGE = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
BAD: list[tuple[str, str, Any, int, str | None]] = [
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("empty ids", "/v1/completions", {"prompt": []}, 400, "prompt"),
    ("prompt too long", "/v1/completions", {"prompt": [5] * 64}, 400, "prompt"),
    ("two prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("id beyond vocab", "/v1/completions", {"prompt": [100_000]}, 400, "prompt"),
    ("missing prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens too big", "/v1/completions", {"prompt": "hi", "max_tokens": 64}, 400, "max_tokens"),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-17"}, 404, "model"),
    ("temperature -1", "/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("top_p 2", "/v1/completions", {"prompt": "hi", "top_p": 2}, 400, "top_p"),
    ("n 0", "/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("n 33", "/v1/completions", {"prompt": "hi", "n": 33}, 400, "n"),
    ("n 2 greedy", "/v1/completions", {"prompt": "hi", "n": 2, "temperature": 0}, 400, "n"),
    ("empty stop string", "/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("presence_penalty 3", "/v1/completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("repetition_penalty 0", "/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("min_tokens > max", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ("logprobs 21", "/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("logprobs -1", "/v1/completions", {"prompt": "hi", "logprobs": -1}, 400, "logprobs"),
    ("wrong type", "/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("malformed json", "/v1/completions", b'{"prompt": "hi",', 400, None),
    ("chat no messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("chat image part", "/v1/chat/completions", {"messages": [IMAGE_MESSAGE]}, 400, "messages[0].content[0].type"),
    ("chat too many tokens", "/v1/chat/completions", {"messages": [HI], "max_completion_tokens": 64}, 400,
     "max_completion_tokens"),
    ("logit_bias key", "/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("logit_bias id", "/v1/completions", {"prompt": "hi", "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    ("allowed_token_ids empty", "/v1/completions", {"prompt": "hi", "allowed_token_ids": []}, 400,
     "allowed_token_ids"),
    ("min_p 2", "/v1/completions", {"prompt": "hi", "min_p": 2}, 400, "min_p"),
    ("guided_json", "/v1/completions", {"prompt": "hi", "guided_json": {"type": "object"}}, 400, "guided_json"),
    ("json mode", "/v1/chat/completions", {"messages": [HI], "response_format": {"type": "json_object"}}, 400,
     "response_format"),
    ("tools", "/v1/chat/completions", {"messages": [HI], "tools": [{"type": "function"}]}, 400, "tools"),
    ("chat n 2 greedy", "/v1/chat/completions", {"messages": [HI], "n": 2, "temperature": 0}, 400, "n"),
    ("chat top_logprobs alone", "/v1/chat/completions", {"messages": [HI], "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat top_logprobs 21", "/v1/chat/completions", {"messages": [HI], "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_openai_error(
    backend: FakeBackend, http: httpx.Client, path: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if param:
        assert param in error["message"]
    if status == 404:
        assert error["code"] == "model_not_found"
    if isinstance(body, bytes):
        assert error["code"] == "invalid_json"
    assert backend.generate_calls == 0


def test_backend_errors(backend: FakeBackend, http: httpx.Client) -> None:
    backend.behavior.fail_first_calls = 1
    r = http.post("/v1/completions", json={"prompt": [5], "max_tokens": 3})
    assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
    backend.behavior.error_after_tokens = 2
    r = http.post("/v1/completions", json={"prompt": [5], "max_tokens": 5})
    assert r.status_code == 500 and "fake KV transfer failed" in r.json()["error"]["message"]
    with http.stream("POST", "/v1/completions", json={"prompt": [5], "max_tokens": 5, "stream": True}) as r:
        events = sse_events(r)
    # the tokens, a last chunk with finish_reason "error", the error event, [DONE]
    assert len(events) == 5 and events[2]["choices"][0]["finish_reason"] == "error"
    assert "fake KV transfer failed" in events[3]["error"]["message"] and events[4] == "[DONE]"
    assert events[3]["error"]["code"] == "backend_error"


def test_a_request_no_worker_could_take_is_503_service_unavailable(backend: FakeBackend, http: httpx.Client) -> None:
    backend.behavior.error_after_tokens, backend.behavior.unavailable = 1, True
    r = http.post("/v1/completions", json={"prompt": [5], "max_tokens": 5})
    assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
    with http.stream("POST", "/v1/completions", json={"prompt": [5], "max_tokens": 5, "stream": True}) as r:
        events = sse_events(r)
    assert events[1]["choices"][0]["finish_reason"] == "error" and events[2]["error"]["code"] == "service_unavailable"
    assert "Traceback" not in str(events) and "ActorDiedError" not in str(events)


# ---- disconnects ---------------------------------------------------------------------------------


def test_disconnect_mid_stream_aborts(env: FakeFrontDoors, backend: FakeBackend) -> None:
    backend.behavior.token_delay_s = 0.02
    body = {"prompt": [5, 6], "max_tokens": 60, "stream": True}
    with httpx.Client(base_url=env.url) as c, c.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    wait_until(lambda: len(backend.abort_calls) == 1, what="backend.abort after disconnect")
    assert backend.abort_calls == [backend.requests[0].request_id] == backend.closed_early


def test_disconnect_while_waiting_for_whole_response_aborts(env: FakeFrontDoors, backend: FakeBackend) -> None:
    backend.behavior.token_delay_s = 0.05
    with httpx.Client(base_url=env.url, timeout=0.3) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 60})
    wait_until(lambda: len(backend.abort_calls) == 1, what="backend.abort after disconnect")


# ---- the official openai client --------------------------------------------------------------------


def test_openai_client(env: FakeFrontDoors, backend: FakeBackend) -> None:
    openai = pytest.importorskip("openai")
    n = n_tokens(env, MULTIBYTE)
    with openai.OpenAI(base_url=f"{env.url}/v1", api_key="unused", max_retries=0) as oa:
        assert [m.id for m in oa.models.list()] == ["tiny-test"]
        done = oa.completions.create(model="tiny-test", prompt=MULTIBYTE, max_tokens=n)
        assert done.choices[0].text == MULTIBYTE and done.usage is not None and done.usage.completion_tokens == n
        stream = oa.completions.create(
            model="tiny-test", prompt=MULTIBYTE, max_tokens=n, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == MULTIBYTE
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 2 * n
        chat = oa.chat.completions.create(
            model="tiny-test", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
        )
        assert chat.choices[0].message.role == "assistant" and chat.usage is not None
        chat_stream = oa.chat.completions.create(
            model="tiny-test", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        assert sum(1 for c in chat_stream if c.choices) == 1 + 3  # the role chunk, then one per token
        with pytest.raises(openai.BadRequestError) as bad:
            oa.completions.create(model="tiny-test", prompt="hi", n=2, temperature=0)
        assert bad.value.body["param"] == "n"
        with pytest.raises(openai.NotFoundError):
            oa.completions.create(model="gpt-17", prompt="hi")


def test_an_idle_keep_alive_connection_outlives_uvicorns_default_5_s_timeout(env: FakeFrontDoors) -> None:
    """Clients pool connections for up to 60 s (aiohttp, vLLM's benchmark client); a server that closes them
    sooner races the client's next request on that connection (seen as a failed request under load)."""
    import http.client
    import time
    from urllib.parse import urlsplit

    url = urlsplit(env.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        assert conn.getresponse().read()
        time.sleep(6)  # uvicorn's default keep-alive is 5 s
        conn.request("GET", "/v1/models")  # the same socket: raises if the server closed it
        assert conn.getresponse().status == 200
    finally:
        conn.close()


# ---- vLLM's /tokenize and /detokenize ---------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip_in_vllms_shape(env: FakeFrontDoors, http: httpx.Client) -> None:
    r = http.post("/tokenize", json={"model": "tiny-test", "prompt": MULTIBYTE, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}  # vLLM's TokenizeResponse
    assert body["tokens"] == list(env.front.tokenize(MULTIBYTE)) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 64 and len(body["token_strs"]) == body["count"]
    bare = http.post("/tokenize", json={"prompt": MULTIBYTE, "add_special_tokens": False}).json()
    assert bare["token_strs"] is None
    assert bare["tokens"] == list(env.front.tokenize(MULTIBYTE, add_special_tokens=False))
    text = http.post("/detokenize", json={"model": "tiny-test", "tokens": bare["tokens"]}).json()
    assert text == {"prompt": MULTIBYTE}


def test_tokenize_chat_gives_the_prompt_a_chat_completion_runs(
    env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client
) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    tokens = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert tokens == list(backend.requests[-1].prompt_token_ids)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"model": "tiny-test"}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "b"}]}, "messages.0.role"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_tokenize_errors_name_the_field(http: httpx.Client, path: str, body: dict[str, Any], param: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert http.post("/tokenize", json={"model": "other", "prompt": "a"}).status_code == 404


def test_vllm_sampling_extensions_reach_the_request(backend: FakeBackend, http: httpx.Client) -> None:
    body = {
        "prompt": "hello world",
        "max_tokens": 4,
        "min_p": 0.1,
        "logit_bias": {"5": 500, "7": -3},
        "allowed_token_ids": [5, 7, 9],
        "response_format": {"type": "text"},
    }
    assert http.post("/v1/completions", json=body).status_code == 200
    sampling = backend.requests[0].sampling
    assert sampling.min_p == 0.1 and sampling.allowed_token_ids == (5, 7, 9)
    assert sampling.logit_bias == ((5, 100.0), (7, -3.0))  # clamped to [-100, 100], as vLLM does


def test_include_stop_str_in_output(backend: FakeBackend, http: httpx.Client) -> None:
    body = {"prompt": "hello world, ok", "max_tokens": 8, "stop": [" world"], "include_stop_str_in_output": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "hello world" and choice["stop_reason"] == " world"
