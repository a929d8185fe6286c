"""The front doors on the real cluster: SDK streaming, abort, bad input, and a client that disconnects."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.fakes import wait_until
from tetriserve.client import InvalidArgument, TetriServeClient


def _idle(frontend: Any) -> bool:
    """Nothing in flight anywhere and no KV block held on either engine."""
    import ray

    cl = frontend.cluster
    if ray.get(cl.scheduler.status.remote())["in_flight"]:
        return False
    for handle in [*cl.prefill.values(), *cl.decode.values()]:
        eng = ray.get(handle.stats.remote())["engine"]
        if eng.running or eng.waiting or eng.kv_usage > 0:
            return False
    return True


def _idle_by_status(frontend: Any) -> bool:
    """What an operator sees in ``tetriserve status``: nothing in flight, no worker running or queueing, every
    decode worker's KV blocks free."""
    status = frontend.loop.run(frontend.admin.status())
    if status.requests_in_flight:
        return False
    for worker in status.workers:
        load = worker.load
        if load.get("running") or load.get("queued"):
            return False
        if worker.role == "decode" and load.get("free_kv_blocks") != load.get("total_kv_blocks"):
            return False
    return True


def _decode_kv_usage(frontend: Any) -> float:
    import ray

    handle = next(iter(frontend.cluster.decode.values()))
    return float(ray.get(handle.stats.remote())["engine"].kv_usage)


def test_grpc_stream_status_and_health(frontend: Any) -> None:
    with TetriServeClient(frontend.grpc_target, timeout=120) as client:
        chunks = list(client.generate("Tell me about disaggregated serving.", max_tokens=12, ignore_eos=True))
        assert chunks[-1].finish_reason == "length"
        assert sum(len(c.token_ids) for c in chunks) == 12
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        assert client.health().serving
        status = client.cluster_status()
        roles = sorted(w.role for w in status.workers)
        assert roles == ["decode", "prefill"]
        assert all(w.state == "active" and w.health == "serving" and w.incarnation == 0 for w in status.workers)


def test_sdk_abort_frees_everything(frontend: Any) -> None:
    _decode_kv_usage(frontend)  # this process's first Ray call takes seconds: not while the request decodes
    with TetriServeClient(frontend.grpc_target, timeout=120) as client:
        stream = client.generate("Write a very long story.", max_tokens=600, ignore_eos=True)
        first = next(iter(stream))
        assert first.token_ids
        # the KV usage read below is vLLM's live block pool: it must see this request's blocks before the abort
        wait_until(lambda: _decode_kv_usage(frontend) > 0, timeout=30, what="decode engine holding KV blocks")
        assert client.abort(stream.request_id)
        rest = list(stream)
        assert rest and rest[-1].finish_reason == "abort"
    wait_until(lambda: _idle(frontend), timeout=30, what="cluster idle after abort")


def test_http_disconnect_mid_stream_aborts_on_every_worker(frontend: Any) -> None:
    body = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 600, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", f"{frontend.http_url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events >= 3:
                break  # leave mid-stream: closing the response drops the connection
    wait_until(lambda: _idle(frontend), timeout=30, what="KV freed on both engines after the disconnect")
    wait_until(lambda: _idle_by_status(frontend), timeout=30, what="`status` showing nothing held after it")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x " * 3000}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 5000}, "max_tokens"),
        ({"prompt": "hi", "temperature": -1.0}, "temperature"),
        ({"prompt": "hi", "model": "no-such-model"}, "model"),
    ],
)
def test_bad_input_is_rejected_and_service_goes_on(frontend: Any, kwargs: dict[str, Any], field: str) -> None:
    with TetriServeClient(frontend.grpc_target, timeout=60) as client:
        prompt = kwargs.pop("prompt")
        with pytest.raises(InvalidArgument) as err:
            client.complete(prompt, **kwargs)
        assert field in str(err.value)
        assert client.complete("still serving?", max_tokens=3, ignore_eos=True).finish_reason == "length"


def test_http_bad_input_gets_openai_error(frontend: Any) -> None:
    url = f"{frontend.http_url}/v1/completions"
    with httpx.Client(timeout=60) as http:
        r = http.post(url, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = http.post(url, json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 4, "top_p": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
        t0 = time.monotonic()
        r = http.post(url, json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 60


def test_a_stop_string_spanning_the_prefill_decode_handoff_ends_the_stream_at_its_first_character(
    frontend: Any,
) -> None:
    """The first token comes from the prefill worker, the second from the decode worker: a stop string made of
    the end of the first's text and the start of the second's is seen whole only by the front door."""
    url = f"{frontend.http_url}/v1/completions"
    base = {"model": "tiny-llama", "temperature": 0, "ignore_eos": True}
    with httpx.Client(timeout=120) as http:
        for word in ("Tell me about", "Once upon a time", "The weather today", "hello", "Why is the sky"):
            first = http.post(url, json={**base, "prompt": word, "max_tokens": 1}).json()["choices"][0]["text"]
            full = http.post(url, json={**base, "prompt": word, "max_tokens": 12}).json()["choices"][0]["text"]
            cut = len(first)
            stop = full[cut - 1 : cut + 1]
            if cut and full.startswith(first) and len(stop) == 2 and full.find(stop) == cut - 1:
                break
        else:
            pytest.skip("no prompt whose first two tokens make a usable stop string")
        body = {**base, "prompt": word, "max_tokens": 12, "stop": [stop], "stream": True}
        with http.stream("POST", url, json=body) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        assert text == full[: cut - 1] and events[-1]["choices"][0]["finish_reason"] == "stop"
    wait_until(lambda: _idle(frontend), timeout=30, what="the stopped request aborted on every worker")
