"""The gRPC gateway and the SDK (sync and async) against an in-process fake backend."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("grpc")

from tests.fakes import FakeBackend, wait_until
from tests.gateway_support import FakeFrontDoors, backend, env
from tetriserve.client import (
    NO_RETRY,
    AsyncTetriServeClient,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    RetryPolicy,
    TetriServeClient,
    Unavailable,
)
from tetriserve.frontdoor.detokenizer import IncrementalDetokenizer
from tetriserve.frontdoor.gateway_grpc import start_grpc_server

__all__ = ["backend", "env"]  # fixtures

FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)
# Characters outside the test tokenizer's training text: each is split over several byte tokens.
MULTIBYTE = "日本語 🚀 ĳ ok"


@pytest.fixture()
def client(env: FakeFrontDoors) -> Iterator[TetriServeClient]:
    with TetriServeClient(env.target, retry=FAST_RETRY) as c:
        yield c


def ids_of(env: FakeFrontDoors, text: str) -> list[int]:
    return list(env.front.tokenize(text))


# ---- streaming and results ---------------------------------------------------------------------


def test_stream_echoes_prompt_text_with_usage_and_timing(
    env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient
) -> None:
    prompt = "hello world, this is a test"
    n = len(ids_of(env, prompt))
    chunks = list(client.generate(prompt, max_tokens=n, request_id="req-1"))
    assert len(chunks) == n and all(c.request_id == "req-1" for c in chunks)
    assert "".join(c.text for c in chunks) == prompt
    assert chunks[0].ttft_ms is not None and chunks[0].ttft_ms >= 0
    assert all(c.finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == "length" and last.e2e_ms is not None
    assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (n, n)
    assert last.metrics["fake_metric"] == 1.0
    assert backend.requests[0].sampling.max_tokens == n


def test_multibyte_characters_are_never_split(
    env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient
) -> None:
    n = len(ids_of(env, MULTIBYTE))
    assert n > len(MULTIBYTE.split()) + 3, "test needs characters spread over several tokens"
    chunks = list(client.generate(MULTIBYTE, max_tokens=n))
    assert all("\ufffd" not in c.text for c in chunks)
    assert any(c.text == "" for c in chunks)  # held back mid-character
    assert "".join(c.text for c in chunks) == MULTIBYTE


def test_detokenizer_holds_an_incomplete_character(env: FakeFrontDoors) -> None:
    ids = ids_of(env, "🚀")
    detok = IncrementalDetokenizer(env.front.tokenizer, [])
    assert len(ids) > 1 and detok.add(ids[:-1]) == ""  # held back: were the stream to end here, it is dropped
    assert detok.add(ids[-1:]) == "🚀"
    detok = IncrementalDetokenizer(env.front.tokenizer, [])
    assert "".join(detok.add([t]) for t in ids) == "🚀"


def test_a_stream_cut_mid_character_drops_the_incomplete_tail_as_vllm_does(
    env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient
) -> None:
    ids = ids_of(env, "ok 🚀")
    chunks = list(client.generate(list(ids), max_tokens=len(ids) - 1))
    assert "".join(c.text for c in chunks) == "ok" and chunks[-1].finish_reason == "length"  # " " + 1st byte: held


def test_complete_and_token_id_prompts(env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient) -> None:
    result = client.complete([5, 6, 7], max_tokens=5, temperature=0.0, top_k=-1, seed=3, slo_ttft_ms=100.0)
    assert result.token_ids == (5, 6, 7, 5, 6) and result.finish_reason == "length"
    assert result.usage is not None and result.usage.total_tokens == 8
    req = backend.requests[0]
    assert (req.sampling.temperature, req.sampling.top_k, req.sampling.seed) == (0.0, 0, 3)
    assert req.slo.ttft_ms == 100.0
    stop = client.complete([5, 6, 7], max_tokens=5, stop_token_ids=[7])
    assert stop.token_ids == (5, 6, 7) and stop.finish_reason == "stop"


def test_default_max_tokens_is_capped_to_context_left(
    env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient
) -> None:
    prompt = [5] * (backend.max_model_len - 3)
    assert len(client.complete(prompt).token_ids) == 3
    assert len(client.complete([5]).token_ids) == 16


def test_health_and_cluster_status(backend: FakeBackend, client: TetriServeClient) -> None:
    health = client.health()
    assert health.serving and health.model == "tiny-test"
    backend.behavior.healthy = False
    assert not client.health().serving
    status = client.cluster_status()
    assert status.model == "tiny-test" and status.dashboard_url.startswith("http")
    assert [(w.worker_id, w.role) for w in status.workers] == [("prefill-0", "prefill"), ("decode-0", "decode")]
    assert status.workers[1].load["free_kv_blocks"] == 42.0


# ---- abort, cancel, deadline ---------------------------------------------------------------------


def test_abort_rpc_ends_stream_with_abort(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.token_delay_s = 0.02
    stream = client.generate([5, 6], max_tokens=60)
    first = next(stream)
    assert first.token_ids == (5,)
    assert client.abort(stream.request_id) is True
    rest = list(stream)
    assert rest[-1].finish_reason == "abort" and len(rest) < 59
    assert client.abort("no-such-request") is False


def test_client_cancel_mid_stream_aborts_backend(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.token_delay_s = 0.02
    with client.generate([5, 6], max_tokens=60) as stream:
        next(stream)
        next(stream)
    wait_until(lambda: stream.request_id in backend.abort_calls, what="backend.abort after cancel")
    wait_until(lambda: stream.request_id in backend.closed_early, what="backend stream closed")


def test_deadline_exceeded(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.token_delay_s = 0.1
    stream = client.generate([5, 6], max_tokens=60, timeout=0.3)
    with pytest.raises(DeadlineExceeded) as info:
        list(stream)
    assert info.value.request_id == stream.request_id
    wait_until(lambda: stream.request_id in backend.abort_calls, what="backend.abort after deadline")


# ---- retries ---------------------------------------------------------------------------------------


def test_unavailable_is_retried_before_first_token(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.fail_first_calls = 2
    result = client.complete([5, 6], max_tokens=3)
    assert result.token_ids == (5, 6, 5)
    assert backend.generate_calls == 3


def test_unavailable_surfaces_when_retries_run_out(env: FakeFrontDoors, backend: FakeBackend) -> None:
    backend.behavior.fail_first_calls = 1
    with TetriServeClient(env.target, retry=NO_RETRY) as c, pytest.raises(Unavailable, match="no prefill worker"):
        c.complete([5], max_tokens=2)
    assert backend.generate_calls == 1


def test_no_retry_after_first_token(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.fail_after_tokens = 2
    got = []
    with pytest.raises(Unavailable, match="decode worker lost"):
        for chunk in client.generate([5, 6, 7], max_tokens=10):
            got.append(chunk)
    assert [c.token_ids for c in got] == [(5,), (6,)]
    assert backend.generate_calls == 1


def test_retry_until_a_late_server_starts(env: FakeFrontDoors, backend: FakeBackend) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handle: dict[str, Any] = {}

    def start_later() -> None:
        async def start() -> None:
            handle["server"], _ = await start_grpc_server(backend, "127.0.0.1", port, front=env.front)

        handle["task"] = env.loop.loop.create_task(start())

    env.loop.loop.call_soon_threadsafe(env.loop.loop.call_later, 0.3, start_later)
    fast_reconnect = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 100)]
    policy = RetryPolicy(max_attempts=50, initial_backoff_s=0.05, max_backoff_s=0.1)
    try:
        with TetriServeClient(f"127.0.0.1:{port}", retry=policy, channel_options=fast_reconnect) as c:
            assert c.complete([5, 6], max_tokens=2, timeout=10).token_ids == (5, 6)
    finally:
        wait_until(lambda: "server" in handle, what="late server started")
        env.loop.run(handle["server"].stop(None))


# ---- errors ---------------------------------------------------------------------------------------


def test_backend_error_is_internal_after_streamed_tokens(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.error_after_tokens = 2
    got = []
    with pytest.raises(InternalError, match="fake KV transfer failed"):
        for chunk in client.generate([5, 6, 7], max_tokens=10):
            got.append(chunk)
    assert len(got) == 2
    assert backend.abort_calls == []  # the request finished (with an error); nothing to abort


def test_a_request_no_worker_could_take_is_unavailable(backend: FakeBackend, client: TetriServeClient) -> None:
    backend.behavior.error_after_tokens, backend.behavior.unavailable = 1, True
    with pytest.raises(Unavailable, match="service unavailable"):
        list(client.generate([5, 6, 7], max_tokens=10))


BAD_INPUTS: list[tuple[str, Any, dict[str, Any], str]] = [
    ("empty text", "", {}, "prompt"),
    ("empty ids", [], {}, "prompt"),
    ("prompt fills context", [5] * 64, {}, "prompt"),
    ("id beyond vocab", [5, 100_000], {}, "prompt"),
    ("negative id", [-1], {}, "prompt"),
    ("max_tokens 0", "hi", {"max_tokens": 0}, "sampling.max_tokens"),
    ("max_tokens too big", "hi", {"max_tokens": 64}, "sampling.max_tokens"),
    ("unknown model", "hi", {"model": "gpt-17"}, "model"),
    ("temperature -1", "hi", {"temperature": -1.0}, "sampling.temperature"),
    ("temperature 2.5", "hi", {"temperature": 2.5}, "sampling.temperature"),
    ("top_p 0", "hi", {"top_p": 0.0}, "sampling.top_p"),
    ("top_p 2", "hi", {"top_p": 2.0}, "sampling.top_p"),
    ("top_k -2", "hi", {"top_k": -2}, "sampling.top_k"),
    ("stop id beyond vocab", "hi", {"stop_token_ids": [100_000]}, "sampling.stop_token_ids"),
    ("negative slo", "hi", {"slo_ttft_ms": -5.0}, "slo.ttft_ms"),
]


@pytest.mark.parametrize(("prompt", "options", "field"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_invalid_argument_naming_the_field(
    backend: FakeBackend, client: TetriServeClient, prompt: Any, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        client.complete(prompt, **options)
    assert info.value.field == field
    assert field in str(info.value)
    assert backend.generate_calls == 0


# ---- async client ---------------------------------------------------------------------------------


def test_async_client_end_to_end(env: FakeFrontDoors, backend: FakeBackend) -> None:
    async def scenario() -> str:
        async with AsyncTetriServeClient(env.target, retry=FAST_RETRY) as c:
            assert (await c.health()).serving
            assert len((await c.cluster_status()).workers) == 2
            n = len(ids_of(env, MULTIBYTE))
            async with c.generate(MULTIBYTE, max_tokens=n) as stream:
                texts = [chunk.text async for chunk in stream]
            assert "".join(texts) == MULTIBYTE
            backend.behavior.fail_first_calls = 1
            assert (await c.complete([5, 6], max_tokens=3)).token_ids == (5, 6, 5)
            with pytest.raises(InvalidArgument) as info:
                await c.complete("hi", top_p=5.0)
            assert info.value.field == "sampling.top_p"
            backend.behavior.token_delay_s = 0.02
            stream = c.generate([5, 6], max_tokens=60)
            await stream.__anext__()
            assert await c.abort(stream.request_id)
            assert [chunk.finish_reason async for chunk in stream][-1] == "abort"
            stream = c.generate([5, 6], max_tokens=60)
            await stream.__anext__()
            await stream.aclose()
            with pytest.raises(DeadlineExceeded):
                await c.complete([5], max_tokens=60, timeout=0.2)
        return stream.request_id

    rid = asyncio.run(scenario())
    wait_until(lambda: rid in backend.abort_calls, what="backend.abort after async cancel")
    assert backend.generate_calls == 6  # 1 + (1 failed + 1) + 1 + 1 + 1; the invalid one never reached it


def test_logprobs_and_vllm_sampling_fields_over_grpc(
    env: FakeFrontDoors, backend: FakeBackend, client: TetriServeClient
) -> None:
    ids = ids_of(env, "hello there")
    done = client.complete(
        list(ids), max_tokens=3, logprobs=2, min_p=0.1, logit_bias={5: 300.0}, allowed_token_ids=[5, 6]
    )
    sampling = backend.requests[0].sampling
    assert sampling.logprobs == 2 and sampling.min_p == pytest.approx(0.1)
    assert sampling.logit_bias == ((5, 100.0),) and sampling.allowed_token_ids == (5, 6)
    assert [lp.token_id for lp in done.logprobs] == list(done.token_ids) == list(ids[:3])
    assert [lp.logprob for lp in done.logprobs] == pytest.approx([-1.0, -1.1, -1.2])  # the fake's
    assert all(lp.top[0][0] == lp.token_id and len(lp.top) == 2 for lp in done.logprobs)
    assert all(lp.token == env.front.token_strings.one(lp.token_id) for lp in done.logprobs)
    assert client.complete("hi", max_tokens=2).logprobs == ()
    with pytest.raises(InvalidArgument) as bad:
        client.complete("hi", max_tokens=2, logprobs=21)
    assert bad.value.field == "sampling.logprobs"
