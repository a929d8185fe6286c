"""A decode worker a call found dead is not dispatched to again until it is back (no Ray, no engine)."""

from __future__ import annotations

from typing import Any

from tetriserve.common.config import ClusterConfig
from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.worker import PrefillWorker


def _load(worker_id: str, incarnation: int) -> DecodeLoad:
    return DecodeLoad(worker_id, 10, 10, 32, 0, 0, 0, 0, 0.0, incarnation=incarnation)


def _worker() -> PrefillWorker:
    worker = PrefillWorker.__new__(PrefillWorker)  # no engine: just the decode view
    worker.config = ClusterConfig()
    worker.decode_loads, worker.decode_addresses, worker._decode_handles = {}, {}, {}
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
