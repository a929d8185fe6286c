"""Process-wide transport endpoints, shared by a worker actor and the KV connector inside its engine.

The worker actor creates its endpoint (so it knows the address it advertises)
and the connector, built later by vLLM in the same process, looks it up by
name. A connector in a process with no registered endpoint creates one from
its ``listen`` setting.
"""

from __future__ import annotations

import threading

from tetriserve.transport.api import Transport
from tetriserve.transport.registry import make_transport

_ENDPOINTS: dict[str, Transport] = {}
_LOCK = threading.Lock()


def get_or_create(
    name: str,
    backend: str = "tcp",
    listen: str = "127.0.0.1:0",
    emulate: tuple[float, float] | None = None,
    lease_s: float = 300.0,
    across_hosts: bool = False,
    pull: bool = True,
) -> Transport:
    """``emulate``: (Gb/s, latency µs) of a slower link to shape this endpoint's sends to; ``lease_s``: how long
    KV parked in it (held, or landed and not taken) is kept; ``across_hosts``: the cluster spans hosts (``auto``
    then listens on UCX too); ``pull``: where the backend offers it (``shm``, ``auto``), peers of this host pull
    what this endpoint publishes, one-sided, instead of being sent it."""
    with _LOCK:
        endpoint = _ENDPOINTS.get(name)
        if endpoint is None:
            options: dict[str, bool] = {"across_hosts": True} if across_hosts and backend == "auto" else {}
            if backend in ("auto", "shm"):
                options["pull"] = pull
            endpoint = make_transport(backend, listen, ttl_s=lease_s, **options)
            if emulate is not None:
                from tetriserve.transport.emulate import EmulatedLink

                endpoint = EmulatedLink(endpoint, *emulate)
            _ENDPOINTS[name] = endpoint
        return endpoint


def get(name: str) -> Transport | None:
    """The endpoint registered under ``name`` in this process, if any."""
    with _LOCK:
        return _ENDPOINTS.get(name)


def close_all() -> None:
    with _LOCK:
        for endpoint in _ENDPOINTS.values():
            endpoint.close()
        _ENDPOINTS.clear()
