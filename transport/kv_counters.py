"""The KV connector's process-wide counters (one engine per worker process), read by the worker's ``stats()``.

Apart from the connector (``kv_connector.py``) so that whoever unpickles them (a front door reading a worker's
stats) need not import vLLM.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class KVCounters:
    """Process-wide totals (one engine per worker process).

    Sending side: what was packed out of the engine's blocks and parked in the endpoint (bytes on
    the wire are the transport's own ``stats()``). Receiving side: what was copied into the blocks.
    """

    bytes_packed: int = 0
    requests_packed: int = 0
    swaps_out: int = 0
    bytes_swapped_out: int = 0
    bytes_loaded: int = 0
    requests_loaded: int = 0
    tokens_loaded: int = 0
    requests_loaded_off_step: int = 0  # of requests_loaded, those copied in on the packer thread (``kv_loads.py``)
    load_failures: int = 0
    pending_loads: int = 0


_COUNTERS = KVCounters()
_COUNTERS_LOCK = threading.Lock()


def counters() -> KVCounters:
    with _COUNTERS_LOCK:
        return _COUNTERS


def bump(**delta: int) -> None:
    global _COUNTERS
    with _COUNTERS_LOCK:
        _COUNTERS = replace(_COUNTERS, **{k: getattr(_COUNTERS, k) + v for k, v in delta.items()})


def set_pending_loads(n: int) -> None:
    global _COUNTERS
    with _COUNTERS_LOCK:
        _COUNTERS = replace(_COUNTERS, pending_loads=n)
