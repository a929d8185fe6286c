"""A front door's requests to a worker: submit one, abort one (``docs/design/ownership.md``).

Over the channel (``channel/core.py``), not Ray: over Ray they lag a burst. With 300 requests at once the
GlobalScheduler places 186 of them by 1 s and the prefill worker has been handed 11, and 34 by 1.5 s; over ZeroMQ
all 300 are at the prefill worker by 1.5 s (``python benchmarks/diagnostics/burst_spans.py --num-prompts 300
--seed 1``, tracing on; the Ray side measured on ed4d9a8). The sockets:

    front door: its process's ``Endpoint`` (``frontdoor/worker_streams.py``), which takes the token streams too
    worker:     one ``Link`` per front door's subscription, connected to that endpoint under the routing id the
                front door's ``attach_intake`` call gave it; it lives as long as the subscription

The routing id names the worker and a random token the front door draws per subscription: it travels only in
that (authenticated) Ray call, so another peer cannot take a worker's messages. A send to a routing id with no
connection (the worker has not connected yet, or its subscription ended) fails at once, and the front door makes
that call over Ray instead. A message sent to a worker that dies before it reads it is lost with the worker's other
requests: its subscription fails and the front door places them again.
"""

from __future__ import annotations

from dataclasses import dataclass

from tetriserve.channel import core
from tetriserve.common.request import Request


@core.message(1)
@dataclass(frozen=True)
class Submit:
    """Take ``request``; its chunks go to the subscription's front door."""

    request: Request


@core.message(2)
@dataclass(frozen=True)
class Abort:
    """Abort ``request_id`` (``attempt``: only that attempt; None: whichever is here)."""

    request_id: str
    attempt: int | None = None


IntakeMessage = Submit | Abort
INTAKE_MESSAGES: tuple[type[IntakeMessage], ...] = (Submit, Abort)
