"""A decode worker a call found dead is not dispatched to again until it is back (no Ray, no engine)."""

from __future__ import annotations

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
    return worker


def test_broadcasts_of_the_life_found_dead_are_ignored_until_a_later_incarnation_comes() -> None:
    worker = _worker()
    worker._dead_decodes["decode-1"] = 2
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 2)], {}, {})
    assert set(worker.decode_loads) == {"decode-0"}  # the monitor has not noticed yet: still listed
    worker.update_decode_view([_load("decode-0", 0), _load("decode-1", 3)], {}, {})
    assert set(worker.decode_loads) == {"decode-0", "decode-1"} and not worker._dead_decodes
