"""Fake workers and a fake cluster for the front door's data path without Ray (``RayBackend`` over real
``StreamHub``s and the channel's sockets, fake actor calls): what the data-path, migration and intake tests share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tests.actor_fakes import FakeHandle
from tetriserve.channel import core
from tetriserve.channel.intake import INTAKE_MESSAGES, IntakeMessage, Submit
from tetriserve.channel.streams import StreamHub
from tetriserve.common.load import PrefillLoad
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.stream import FinishReason, Heartbeat, StreamChunk
from tetriserve.control_plane.global_scheduler import GlobalScheduler
from tetriserve.frontdoor.ray_backend import RayBackend


class FakeWorker:
    """A worker's stream hub, with the requests it was given and the aborts it got."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.streams = StreamHub()
        self.submitted: dict[str, tuple[Request, str]] = {}
        self.aborted: list[str] = []
        self.aborts: list[tuple[str, int | None]] = []
        self.broken: bool | Exception = False  # set: its control stream fails at the next heartbeat (with this)
        self.forgot: set[str] = set()  # requests its heartbeats leave out (lost without a word)
        self.routes: list[tuple[str, bytes]] = []  # the intake each subscription attached to
        self.early_attaches = 0  # attach calls to answer "no subscription here yet"
        self.reader: core.Link | None = None
        self.intake: list[IntakeMessage] = []  # what came over the intake

    def _beat(self, subscriber: str) -> Heartbeat:
        held = [(rid, r.attempt) for rid, (r, sub) in self.submitted.items() if sub == subscriber]
        return Heartbeat(self.worker_id, 0, tuple(h for h in held if h[0] not in self.forgot))

    async def subscribe(self, subscriber: str, address: str) -> Any:
        try:
            async for beat in self.streams.serve(subscriber, address, lambda: self._beat(subscriber), heartbeat_s=0.01):
                if isinstance(self.broken, Exception):
                    raise self.broken
                if self.broken:
                    raise ConnectionError("the worker's stream broke")
                yield beat
        finally:
            if self.reader is not None:
                self.reader.close()

    def attach_intake(self, subscriber: str, address: str, route: bytes) -> bool:
        """The front door's submits and aborts over the intake, as a worker's (``Worker.attach_intake``)."""
        if self.early_attaches > 0:  # the call overtook the subscription: not subscribed yet, as a worker says
            self.early_attaches -= 1
            return False
        self.routes.append((address, route))
        self.reader = core.Link(
            address, route, f"intake of {self.worker_id}", accepts=INTAKE_MESSAGES,
            on_message=lambda m: self._deliver(m, subscriber),
        )  # fmt: skip
        return True

    def _deliver(self, message: IntakeMessage, subscriber: str) -> None:
        self.intake.append(message)
        if isinstance(message, Submit):
            self.submit(message.request, subscriber)
        else:
            self.abort(message.request_id, message.attempt)

    def submit(self, req: Request, subscriber: str) -> None:
        self.submitted[req.request_id] = (req, subscriber)

    def emit(self, rid: str, tokens: tuple[int, ...], index: int, finish: str | None = None, **kw: Any) -> None:
        _, sub = self.submitted[rid]
        reason = FinishReason(finish) if finish else None
        self.streams.publish(sub, StreamChunk(rid, tokens, reason, worker=self.worker_id, index=index, **kw))

    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        self.aborted.append(request_id)
        self.aborts.append((request_id, attempt))
        return True

    def observe(self, prompt_len: int, output_len: int) -> None:
        return None


@dataclass
class FakeCluster:
    scheduler: Any
    prefill: dict[str, Any]
    decode: dict[str, Any]
    model_path: str = ""
    config: Any = None
    monitor: Any = None
    dashboard_url: str = ""
    workers: dict[str, FakeWorker] = field(default_factory=dict)


def fake_cluster(prefill: int = 1, decode: int = 2) -> tuple[FakeCluster, GlobalScheduler]:
    workers = {f"prefill-{i}": FakeWorker(f"prefill-{i}") for i in range(prefill)}
    workers |= {f"decode-{i}": FakeWorker(f"decode-{i}") for i in range(decode)}
    handles = {wid: FakeHandle(w) for wid, w in workers.items()}
    p = {k: h for k, h in handles.items() if k.startswith("prefill")}
    d = {k: h for k, h in handles.items() if k.startswith("decode")}
    gs = GlobalScheduler(p)
    gs.prefill_loads = {wid: PrefillLoad(wid, 0, 0, 0, 0.0) for wid in p}  # the monitor's broadcast: all serve
    return FakeCluster(FakeHandle(gs), p, d, workers=workers), gs


def make_request(rid: str, max_tokens: int = 8) -> Request:
    return Request(rid, (1, 2, 3), SamplingSpec(max_tokens=max_tokens))


async def wait_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def collect(backend: RayBackend, req: Request) -> list[StreamChunk]:
    return [c async for c in backend.generate(req)]
