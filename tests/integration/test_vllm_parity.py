"""The OpenAI front door against a plain vLLM OpenAI server on the same model and prompts: greedy
text, token strings and logprobs, usage, finish and stop reasons, stream framing, ``n`` and the refusals.

Both sides run float32 without torch.compile, so greedy answers must agree token for token, though ours are
produced by two engines (the prefill worker's first token, the decode worker's rest) and theirs by one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.vllm_reference import plain_vllm

GREEDY = {"model": "tiny-llama", "temperature": 0}
REFERENCE_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--block-size", "32")
LOGPROB_TOL = 1e-4

COMPLETIONS = [
    {"prompt": "Hello there, how", "max_tokens": 10, "logprobs": 3},
    {"prompt": "The quick brown fox jumps over", "max_tokens": 12, "logprobs": 0, "ignore_eos": True},
    {"prompt": "Once upon a time", "max_tokens": 16, "presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"prompt": "Once upon a time", "max_tokens": 16, "repetition_penalty": 1.3, "min_tokens": 4},
    {"prompt": [5, 17, 300, 42, 9], "max_tokens": 8, "logprobs": 5},
    {"prompt": "Hello there, how", "max_tokens": 8, "logit_bias": {"300": 6.0, "17": 4.0}, "logprobs": 2},
    {"prompt": "Once upon a time", "max_tokens": 8, "allowed_token_ids": [300, 17, 42, 9, 5], "logprobs": 1},
    {"prompt": "Once upon a time", "max_tokens": 8, "min_p": 0.05, "skip_special_tokens": False},
]
CHATS = [
    {"messages": [{"role": "user", "content": "Hi, what's up?"}], "max_tokens": 8, "logprobs": True, "top_logprobs": 2},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
        ],
        "max_completion_tokens": 10,
        "logprobs": True,
    },
]


@pytest.fixture(scope="module")
def reference(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with plain_vllm(model_path, log, REFERENCE_ARGS) as url:  # prestarted: conftest.py
        yield url


@pytest.fixture(scope="module")
def ours(frontend: Any) -> str:
    return str(frontend.http_url)


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def _answer(choice: dict[str, Any]) -> str:
    return str(choice["text"] if "text" in choice else choice["message"]["content"])


def _same_logprobs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    if "content" in a:  # chat
        assert [c["token"] for c in a["content"]] == [c["token"] for c in b["content"]]
        assert [c["bytes"] for c in a["content"]] == [c["bytes"] for c in b["content"]]
        assert [c["logprob"] for c in a["content"]] == pytest.approx(
            [c["logprob"] for c in b["content"]], abs=LOGPROB_TOL
        )
        for x, y in zip(a["content"], b["content"], strict=True):
            assert [t["token"] for t in x["top_logprobs"]] == [t["token"] for t in y["top_logprobs"]]
        return
    assert set(a) == set(b)
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=LOGPROB_TOL)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
        assert list(x) == list(y) and list(x.values()) == pytest.approx(list(y.values()), abs=LOGPROB_TOL)


def _same_answer(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["object"] == b["object"]
    assert len(a["choices"]) == len(b["choices"])
    for x, y in zip(a["choices"], b["choices"], strict=True):
        assert set(x) <= set(y), f"fields vLLM does not send: {set(x) - set(y)}"
        assert _answer(x) == _answer(y)
        assert (x["finish_reason"], x["stop_reason"]) == (y["finish_reason"], y["stop_reason"])
        _same_logprobs(x["logprobs"], y["logprobs"])
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert a["usage"][key] == b["usage"][key], key


@pytest.mark.parametrize("body", COMPLETIONS, ids=lambda b: ",".join(k for k in b if k != "prompt"))
def test_completions_match_plain_vllm(ours: str, reference: str, body: dict[str, Any]) -> None:
    a, b = _post(ours, "/v1/completions", {**GREEDY, **body}), _post(reference, "/v1/completions", {**GREEDY, **body})
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    _same_answer(a.json(), b.json())


@pytest.mark.parametrize("body", CHATS, ids=["top_logprobs", "system+parts"])
def test_chat_matches_plain_vllm(ours: str, reference: str, body: dict[str, Any]) -> None:
    path = "/v1/chat/completions"
    a, b = _post(ours, path, {**GREEDY, **body}), _post(reference, path, {**GREEDY, **body})
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    _same_answer(a.json(), b.json())


def test_stop_strings_and_stop_token_ids_match_plain_vllm(ours: str, reference: str) -> None:
    base = {**GREEDY, "prompt": "Hello there, how", "max_tokens": 16, "ignore_eos": True}
    full = _post(reference, "/v1/completions", {**base, "logprobs": 0}).json()["choices"][0]
    words = full["logprobs"]["tokens"]
    stop = words[4].strip() or words[4]
    for extra in (
        {"stop": [stop]},
        {"stop": [stop], "include_stop_str_in_output": True},
        {"stop_token_ids": [_token_id(reference, words[3])]},
    ):
        body = {**base, **extra, "logprobs": 1}
        a, b = _post(ours, "/v1/completions", body).json(), _post(reference, "/v1/completions", body).json()
        assert b["choices"][0]["finish_reason"] == "stop", b
        _same_answer(a, b)


def _token_id(url: str, token: str) -> int:
    ids = _post(url, "/tokenize", {"model": "tiny-llama", "prompt": token, "add_special_tokens": False}).json()
    return int(ids["tokens"][-1])


def _stream(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [
            line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in r.iter_lines()
            if line[:6] == "data: "
        ]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streams_match_plain_vllm(ours: str, reference: str, path: str) -> None:
    body: dict[str, Any] = {**GREEDY, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    if path.endswith("chat/completions"):
        body |= {"messages": [{"role": "user", "content": "Tell me a story."}], "logprobs": True, "top_logprobs": 1}
    else:
        body |= {"prompt": "Tell me a story.", "logprobs": 2}
    a, b = _stream(ours, path, body), _stream(reference, path, body)
    assert a[-1] == b[-1] == "[DONE]"
    assert a[-2]["choices"] == b[-2]["choices"] == [] and a[-2]["usage"] == {
        k: b[-2]["usage"][k] for k in a[-2]["usage"]
    }
    key = "delta" if "chat" in path else "text"

    def text(events: list[Any]) -> str:
        parts = [e["choices"][0][key] for e in events[:-2] if e["choices"]]
        return "".join(p.get("content") or "" if isinstance(p, dict) else p for p in parts)

    def tokens(events: list[Any]) -> list[str]:
        lps = [e["choices"][0]["logprobs"] for e in events[:-2] if e["choices"] and e["choices"][0]["logprobs"]]
        return [t for lp in lps for t in (lp["tokens"] if "tokens" in lp else [c["token"] for c in lp["content"]])]

    assert text(a) == text(b) and tokens(a) == tokens(b)
    assert not any("usage" in e for e in [*a[:-2], *b[:-2]] if e["choices"])  # only the last event has usage
    assert a[-3]["choices"][0]["finish_reason"] == b[-3]["choices"][0]["finish_reason"] == "length"
    if "chat" in path:
        assert a[0]["choices"][0]["delta"] == b[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_n_choices_have_vllm_shape(ours: str, reference: str) -> None:
    body = {
        "model": "tiny-llama",
        "prompt": "Hello there, how",
        "max_tokens": 4,
        "n": 3,
        "seed": 11,
        "ignore_eos": True,
    }
    a, b = _post(ours, "/v1/completions", body).json(), _post(reference, "/v1/completions", body).json()
    assert [c["index"] for c in a["choices"]] == [c["index"] for c in b["choices"]] == [0, 1, 2]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] == 12
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "n": 2, "temperature": 0}),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}),
    ],
    ids=["n greedy", "logprobs 21", "top_logprobs alone", "max_tokens too big"],
)
def test_both_refuse_the_same_requests(ours: str, reference: str, path: str, body: dict[str, Any]) -> None:
    a, b = _post(ours, path, {"model": "tiny-llama", **body}), _post(reference, path, {"model": "tiny-llama", **body})
    assert a.status_code == b.status_code == 400, (a.text, b.text)
    assert set(a.json()["error"]) == set(b.json()["error"])


def test_tokenize_and_detokenize_match_plain_vllm(ours: str, reference: str) -> None:
    for body in (
        {"prompt": "Hello 日本 🚀", "return_token_strs": True},
        {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True},
    ):
        a, b = _post(ours, "/tokenize", body).json(), _post(reference, "/tokenize", body).json()
        assert {k: a[k] for k in ("count", "tokens", "token_strs")} == {
            k: b.get(k) for k in ("count", "tokens", "token_strs")
        }
        a, b = (
            _post(ours, "/detokenize", {"tokens": a["tokens"]}),
            _post(reference, "/detokenize", {"tokens": b["tokens"]}),
        )
        assert a.json()["prompt"] == b.json()["prompt"]


def test_grpc_logprobs_match_plain_vllm(frontend: Any, reference: str) -> None:
    from tetriserve.client import TetriServeClient

    body = {**GREEDY, "prompt": "Hello there, how", "max_tokens": 6, "logprobs": 2}
    theirs = _post(reference, "/v1/completions", body).json()["choices"][0]
    with TetriServeClient(frontend.grpc_target, timeout=120) as client:
        ours = client.complete("Hello there, how", max_tokens=6, temperature=0.0, logprobs=2)
    assert ours.text == theirs["text"]
    assert [lp.token for lp in ours.logprobs] == theirs["logprobs"]["tokens"]
    assert [lp.logprob for lp in ours.logprobs] == pytest.approx(theirs["logprobs"]["token_logprobs"], abs=LOGPROB_TOL)
    assert [[t for _, t, _ in lp.top] for lp in ours.logprobs] == [list(t) for t in theirs["logprobs"]["top_logprobs"]]


def test_continuous_usage_stats_match_plain_vllm(ours: str, reference: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {**GREEDY, "prompt": "Tell me a story.", "max_tokens": 6, "stream": True, "stream_options": options}
    a, b = _stream(ours, "/v1/completions", body), _stream(reference, "/v1/completions", body)
    for events in (a, b):
        assert all("usage" in e for e in events[:-1])
    last = [e for e in a[:-1] if e["choices"]][-1]["usage"]
    assert last == {k: [e for e in b[:-1] if e["choices"]][-1]["usage"][k] for k in last}
