"""SIGTERM's drain at the front doors (``serve.run_front_doors``): unready at once, admitted streams finish."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from typing import Any

import httpx

from tests.fakes import FakeBackend, LoopThread, tokenizer_dir, wait_until
from tetriserve.cli.serve import Endpoints, run_front_doors
from tetriserve.client import TetriServeClient, Unavailable
from tetriserve.client.retry import NO_RETRY
from tetriserve.common.config import ClusterConfig


def test_a_drain_turns_away_new_requests_and_lets_admitted_ones_finish() -> None:
    backend = FakeBackend(tokenizer_dir())
    backend.behavior.token_delay_s = 0.3
    config = ClusterConfig(grpc_port=0, http_port=0, drain_grace_s=20)
    loop = LoopThread()
    stop = asyncio.Event()
    ready: Future[Endpoints] = Future()

    async def serve() -> None:
        endpoints: asyncio.Future[Endpoints] = asyncio.get_running_loop().create_future()
        endpoints.add_done_callback(lambda f: ready.set_result(f.result()))
        await run_front_doors(config, backend, backend, stop, endpoints)

    served = asyncio.run_coroutine_threadsafe(serve(), loop.loop)
    ep = ready.result(timeout=60)
    events: list[Any] = []
    first = threading.Event()

    def held_stream() -> None:
        body = {"model": "tiny-test", "prompt": "hello there", "max_tokens": 6, "stream": True}
        with httpx.Client(base_url=ep.http, timeout=30) as c, c.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    first.set()

    reader = threading.Thread(target=held_stream)
    reader.start()
    try:
        assert first.wait(10)
        with httpx.Client(base_url=ep.http, timeout=10) as http:
            assert http.get("/ready").status_code == 200
            loop.loop.call_soon_threadsafe(stop.set)  # what SIGTERM does
            wait_until(lambda: http.get("/ready").status_code == 503, what="unready")
            assert http.get("/health").status_code == 200  # still live
            refused = http.post("/v1/completions", json={"model": "tiny-test", "prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        with TetriServeClient(ep.grpc, retry=NO_RETRY) as client:
            assert client.health().serving is False
            try:
                client.complete(prompt="hi", max_tokens=2)
                raise AssertionError("a draining front door admitted a request")
            except Unavailable:
                pass
        reader.join(20)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] == "length"  # ran to its end, not cut
        served.result(timeout=20)  # the front doors stop once nothing is in flight
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        reader.join(5)
        loop.stop()
