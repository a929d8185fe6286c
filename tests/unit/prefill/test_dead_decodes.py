"""A decode worker a call found dead is not dispatched to again until it is back (``prefill_worker/directory.py``,
``handoff.py``; no Ray, no engine)."""

from __future__ import annotations

import asyncio
import random

from tests.actor_fakes import FakeHandle
from tetriserve.channel.handoff import Take
from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy
from tetriserve.prefill_worker.handoff import Handoff
from tetriserve.prefill_worker.kv_sends import KVSender
from tetriserve.prefill_worker.lifecycle import PrefillJob, view_of
from tetriserve.transport.api import TransferHandle


def _load(worker_id: str, incarnation: int) -> DecodeLoad:
    return DecodeLoad(worker_id, 10, 10, 32, 0, 0, 0, 0, 0.0, incarnation=incarnation)


def _directory() -> tuple[DecodeDirectory, list[tuple[str, int]]]:
    """A decode directory and what the monitor was told of lives found dead."""
    marked: list[tuple[str, int]] = []
    dispatcher = make_dispatch_policy("round-robin", DispatchParams(512))
    found = DecodeDirectory("prefill-0", dispatcher, random.Random(0), 512, lambda d, n: marked.append((d, n)))
    return found, marked


def test_broadcasts_of_the_life_found_dead_are_ignored_until_a_later_incarnation_comes() -> None:
    found, _ = _directory()
    found.update([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    found.died("decode-1")
    found.update([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    assert set(found.loads) == {"decode-0"}  # the monitor has not noticed yet: still listed
    found.update([_load("decode-0", 0), _load("decode-1", 3)], {}, {})
    assert set(found.loads) == {"decode-0", "decode-1"}
    found.update([_load("decode-0", 0), _load("decode-1", 3)], {}, {})
    assert set(found.loads) == {"decode-0", "decode-1"}  # the new life is no longer held against it


def test_a_decode_worker_found_dead_leaves_dispatch_at_once_and_the_monitor_hears_of_it() -> None:
    found, marked = _directory()
    found.update([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    found.died("decode-1")
    assert set(found.loads) == {"decode-0"}  # before any broadcast: the next dispatch cannot pick it
    assert marked == [("decode-1", 2)]  # its next broadcast leaves it out for every prefill worker
    found.died("decode-1")  # a second call that found it dead: told once
    assert marked == [("decode-1", 2)]
    found.update([_load("decode-0", 0), _load("decode-1", 2)], {}, {})  # a broadcast on its way
    assert set(found.loads) == {"decode-0"}


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


class _Handoff:
    """A handoff over fake decode workers, with ``key``'s KV lent to decode-0 (``lent_bytes`` of it read)."""

    def __init__(self, decodes: dict[str, _Decode], lent_bytes: int) -> None:
        self.directory, self.marked = _directory()
        self.directory.update(
            [_load(d, 0) for d in decodes],
            {d: f"shm://host/{d}" for d in decodes},
            {d: FakeHandle(x) for d, x in decodes.items()},  # type: ignore[misc]
        )
        self.directory._peers = dict(decodes)  # type: ignore[arg-type]
        endpoint = _Endpoint()
        self.sender = KVSender("prefill-0", endpoint, self.directory, 30.0)  # type: ignore[arg-type]
        config = ClusterConfig()
        self.handoff = Handoff(config, endpoint, self.directory, self.sender, None, None)  # type: ignore[arg-type]
        req = Request("r", (1, 2, 3), SamplingSpec(max_tokens=16))
        self.job = PrefillJob(req, "frontdoor-x", view_of(req))
        self.lending = TransferHandle(req.kv_key, 0)
        self.lending.nbytes = lent_bytes  # what of the lent KV has left for the reader so far
        self.sender.track(req.kv_key, self.lending, "decode-0")

    def take(self, pull_from: str | None) -> tuple[str, bool, str | None]:
        decode_id, peer, error = asyncio.run(self.handoff._take(self.job, (7,), "decode-0", pull_from))
        return decode_id, peer is not None, error


def test_a_decode_worker_dead_at_take_before_its_lent_kv_left_is_passed_over_in_the_same_attempt() -> None:
    decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
    handing = _Handoff(decodes, lent_bytes=0)
    assert handing.take(_Endpoint.address) == ("decode-1", True, None)
    assert decodes["decode-1"].taken == [("r", _Endpoint.address)]  # it pulls the same lent KV
    assert handing.sender.receiver(handing.job.key) == "decode-1"  # a failed pull is told to it
    assert handing.marked == [("decode-0", 0)] and "decode-0" not in handing.directory.loads


def test_a_decode_worker_dead_at_take_after_some_kv_left_or_sent_ends_the_attempt() -> None:
    for lent_bytes, pull_from in ((4096, _Endpoint.address), (0, None)):  # part of it pulled; or pushed there
        decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
        decode_id, taken, error = _Handoff(decodes, lent_bytes).take(pull_from)
        assert (decode_id, taken) == ("decode-0", False) and "decode-0 is unavailable" in (error or "")
        assert not decodes["decode-1"].taken


def test_a_lending_past_its_deadline_by_the_time_another_decode_worker_serves_ends_the_attempt() -> None:
    decodes = {"decode-0": _Decode(dead=True), "decode-1": _Decode()}
    handing = _Handoff(decodes, lent_bytes=0)
    handing.lending.complete(f"{handing.job.key} was not pulled within its deadline")
    decode_id, taken, _ = handing.take(_Endpoint.address)
    assert (decode_id, taken) == ("decode-0", False) and not decodes["decode-1"].taken
