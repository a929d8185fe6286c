"""A decode worker a call found dead is not dispatched to again until it is back (no Ray, no engine)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.channel.handoff import Take
from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad
from tetriserve.common.request import Request
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
from tetriserve.prefill_worker.views import ReqView
from tetriserve.prefill_worker.worker import PrefillWorker
from tetriserve.transport.api import TransferHandle


def _load(worker_id: str, incarnation: int) -> DecodeLoad:
    return DecodeLoad(worker_id, 10, 10, 32, 0, 0, 0, 0, 0.0, incarnation=incarnation)


def _worker() -> PrefillWorker:
    worker = PrefillWorker.__new__(PrefillWorker)  # no engine, no queue: just the decode view
    worker.config = ClusterConfig(prefill={"offload_wait_s": 0})  # nothing queued to offer (test_offload.py)
    worker.decode_loads, worker.decode_addresses, worker._decode_peers = {}, {}, {}
    worker._dead_decodes = {}
    worker._monitor = _Monitor()
    return worker


class _Monitor:
    def __init__(self) -> None:
        self.marked: list[tuple[str, int]] = []
        self.mark_dead = self

    def remote(self, *args: Any) -> None:
        self.marked.append(args)


def test_broadcasts_of_the_life_found_dead_are_ignored_until_a_later_incarnation_comes() -> None:
    worker = _worker()
    worker._dead_decodes["decode-1"] = 2
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    assert set(worker.decode_loads) == {"decode-0"}  # the monitor has not noticed yet: still listed
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 3)], {}, {})
    assert set(worker.decode_loads) == {"decode-0", "decode-1"} and not worker._dead_decodes


def test_a_decode_worker_found_dead_leaves_dispatch_at_once_and_the_monitor_hears_of_it() -> None:
    worker = _worker()
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    worker.decode_died("decode-1")
    assert set(worker.decode_loads) == {"decode-0"}  # before any broadcast: the next dispatch cannot pick it
    assert worker._monitor.marked == [("decode-1", 2)]  # its next broadcast leaves it out for every prefill worker
    worker.decode_died("decode-1")  # a second call that found it dead: told once
    assert worker._monitor.marked == [("decode-1", 2)]
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 2)], {}, {})  # a broadcast on its way
    assert set(worker.decode_loads) == {"decode-0"}


class _Decode:
    """A decode worker as the handoff calls it (its ``DecodePeer``): Ray's ActorDiedError once it is dead."""

    def __init__(self, dead: bool = False) -> None:
        self.dead = dead
        self.taken: list[tuple[str, str | None]] = []

    async def take(self, message: Take) -> bool:
        if self.dead:
            from ray.exceptions import ActorDiedError

            raise ActorDiedError()
        self.taken.append((message.request.request_id, message.pull_from))
        return True

    def close(self) -> None:
        self.closed = True


class _Endpoint:
    address = "shm://host/prefill-0"

    def lends_to(self, address: str) -> bool:
        return address.startswith("shm://host/")


def _handing_off(decodes: dict[str, _Decode], lent_bytes: int) -> tuple[PrefillWorker, Request, ReqView]:
    worker = _worker()
    worker.worker_id = "prefill-0"
    worker.dispatcher = make_dispatch_policy("round-robin", DispatchParams(512))
    worker.rng = random.Random(0)
    worker.endpoint = _Endpoint()
    worker._aborted = {}
    worker.update_decode_view(
        [_load(d, 0) for d in decodes],
        {d: f"shm://host/{d}" for d in decodes},
        {d: FakeHandle(x) for d, x in decodes.items()},
    )
    worker._decode_peers = dict(decodes)  # type: ignore[arg-type]
    req = Request("r", (1, 2, 3))
    lending = TransferHandle(req.kv_key, 0)
    lending.nbytes = lent_bytes  # what of the lent KV has left for the reader so far
    worker._sends = {req.kv_key: (lending, "decode-0")}
    return worker, req, ReqView("r", 3, 16, 0.0)


def test_a_decode_worker_dead_at_take_before_its_lent_kv_left_is_passed_over_in_the_same_attempt() -> None:
    decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
    worker, req, view = _handing_off(decodes, lent_bytes=0)
    got = asyncio.run(worker._take(req, (7,), view, "frontdoor-x", "decode-0", _Endpoint.address))
    assert got == ("decode-1", True, None)
    assert decodes["decode-1"].taken == [("r", _Endpoint.address)]  # it pulls the same lent KV
    assert worker._sends[req.kv_key][1] == "decode-1"  # a failed pull is told to it
    assert worker._monitor.marked == [("decode-0", 0)] and "decode-0" not in worker.decode_loads


def test_a_decode_worker_dead_at_take_after_some_kv_left_or_sent_ends_the_attempt() -> None:
    for lent_bytes, pull_from in ((4096, _Endpoint.address), (0, None)):  # part of it pulled; or pushed there
        decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
        worker, req, view = _handing_off(decodes, lent_bytes)
        decode_id, taken, error = asyncio.run(worker._take(req, (7,), view, "frontdoor-x", "decode-0", pull_from))
        assert (decode_id, taken) == ("decode-0", False) and "decode-0 is unavailable" in (error or "")
        assert not decodes["decode-1"].taken


def test_a_lending_past_its_deadline_by_the_time_another_decode_worker_serves_ends_the_attempt() -> None:
    decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
    worker, req, view = _handing_off(decodes, lent_bytes=0)
    worker._sends[req.kv_key][0].complete(f"{req.kv_key} was not pulled within its deadline")
    decode_id, taken, _ = asyncio.run(worker._take(req, (7,), view, "frontdoor-x", "decode-0", _Endpoint.address))
    assert (decode_id, taken) == ("decode-0", False) and not decodes["decode-1"].taken
