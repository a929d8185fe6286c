"""``n`` choices, logprobs and ``stop_reason`` on the OpenAI gateway (FakeBackend; vLLM's shapes, see
``frontdoor/logprobs.py``), and the token strings of logprobs on a byte-level tokenizer."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeBackend, fake_logprobs, tokenizer_dir
from tests.gateway_support import FakeFrontDoors, backend, env, http, sse_events
from tetriserve.common.stream import TokenLogprobs
from tetriserve.frontdoor.core import load_tokenizer
from tetriserve.frontdoor.logprobs import LogprobNamer, TokenStrings

__all__ = ["backend", "env", "http"]  # fixtures

TEXT = "hello world, ok"


def test_completion_logprobs_whole(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 5, "logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    prompt = backend.requests[0].prompt_token_ids
    strings = TokenStrings(env.front.tokenizer)
    assert lp["tokens"] == [strings.one(t) for t in prompt[:5]]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    assert lp["token_logprobs"] == pytest.approx([-(1 + i / 10) for i in range(5)])
    for i, (tok, top) in enumerate(zip(prompt[:5], lp["top_logprobs"], strict=True)):
        expected = fake_logprobs(tok, i, 2)
        assert list(top.values()) == pytest.approx(list(expected.logprobs))  # the sampled token first, then by rank
        assert next(iter(top)) == strings.one(tok)
    assert backend.requests[0].sampling.logprobs == 2


def test_completion_logprobs_stream_offsets_continue(
    env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client
) -> None:
    body = {"prompt": TEXT, "max_tokens": 4, "logprobs": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r)[:-1]
    lps = [e["choices"][0]["logprobs"] for e in events]
    tokens = [t for lp in lps for t in lp["tokens"]]
    offsets = [o for lp in lps for o in lp["text_offset"]]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert all(len(top) == 1 for lp in lps for top in lp["top_logprobs"])  # logprobs=0: the sampled token only
    assert events[-1]["choices"][0]["stop_reason"] is None and events[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_logprobs(env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": TEXT}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    strings = TokenStrings(env.front.tokenizer)  # special tokens are named too (vLLM's), though not in the text
    assert [c["token"] for c in content] == [strings.one(t) for t in backend.requests[0].prompt_token_ids[:3]]
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode())
        assert len(item["top_logprobs"]) == 2 and item["top_logprobs"][0]["token"] == item["token"]
    assert backend.requests[0].sampling.logprobs == 2
    body = {"messages": [{"role": "user", "content": TEXT}], "max_tokens": 2, "logprobs": True, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r)[:-1]
    assert events[0]["choices"][0]["logprobs"] is None  # the role chunk
    assert [len(e["choices"][0]["logprobs"]["content"]) for e in events[1:]] == [1, 1]
    assert all(e["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == [] for e in events[1:])
    no_lp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": TEXT}], "max_tokens": 2})
    assert no_lp.json()["choices"][0]["logprobs"] is None


def test_n_choices_whole(backend: FakeBackend, http: httpx.Client) -> None:
    body = {"prompt": TEXT, "max_tokens": 3, "n": 3, "seed": 7}
    r = http.post("/v1/completions", json=body, headers={"x-request-id": "abc"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2] and out["id"] == "cmpl-abc"
    prompt_tokens = len(backend.requests[0].prompt_token_ids)
    assert out["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 9, "total_tokens": prompt_tokens + 9}
    assert sorted(r.request_id for r in backend.requests) == ["0_abc", "1_abc", "2_abc"]  # vLLM's child ids
    assert sorted(r.sampling.seed for r in backend.requests) == [7, 8, 9]  # each choice its own seed


def test_n_choices_stream(backend: FakeBackend, http: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": TEXT}],
        "max_tokens": 2,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    roles = [e["choices"][0] for e in events[:2]]
    assert [c["index"] for c in roles] == [0, 1] and all(
        c["delta"] == {"role": "assistant", "content": ""} for c in roles
    )
    finishes = [e["choices"][0]["index"] for e in events[2:-2] if e["choices"][0]["finish_reason"] is not None]
    assert sorted(finishes) == [0, 1]


def test_n_choices_one_failing_fails_the_response(backend: FakeBackend, http: httpx.Client) -> None:
    backend.behavior.error_after_tokens = 1
    r = http.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 3, "n": 2})
    assert r.status_code == 500 and r.json()["error"]["code"] == "backend_error"


def test_stop_reason_names_the_stop_string_and_token(
    env: FakeFrontDoors, backend: FakeBackend, http: httpx.Client
) -> None:
    choice = http.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 8, "stop": [" world"]}).json()
    assert choice["choices"][0]["stop_reason"] == " world" and choice["choices"][0]["text"] == "hello"
    stop_id = env.front.tokenize(TEXT)[2]
    choice = http.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 8, "stop_token_ids": [stop_id]}).json()
    assert choice["choices"][0]["stop_reason"] == stop_id and choice["choices"][0]["finish_reason"] == "stop"


def test_token_strings_complete_a_character_split_over_tokens() -> None:
    """vLLM's rule: a piece of a character is "" until the token that completes it, which names the character
    (so the token strings add up to the text), with the output before it as context."""
    tok = load_tokenizer(str(tokenizer_dir()))
    ids = tok.encode("ok 日本 🚀", add_special_tokens=False)
    assert any(tok.decode([t]).endswith("\ufffd") for t in ids)  # the byte-level tokenizer splits characters
    namer = LogprobNamer(TokenStrings(tok))
    half = len(ids) // 2  # named in two chunks, as across the prefill -> decode handoff
    names = namer.name(ids[:half], None) + namer.name(ids[half:], [TokenLogprobs((t,), (-1.0,)) for t in ids[half:]])
    assert "".join(e.token for e in names) == "ok 日本 🚀"
    assert [e.logprob for e in names] == [None] * half + [-1.0] * (len(ids) - half)
