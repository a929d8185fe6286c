"""The worker actor: one engine for its whole life, either role, flipped in place (TetriInfer §3.5).

    Worker "prefill-0" / "decode-1" (a named Ray actor)
      ├─ the engine, its KV endpoint and output streams      built once (``build_worker_engine``)
      └─ role: PrefillWorker | DecodeWorker                  what the calls below reach
           flip(role): the role is idle (drained) ─▶ retire it ─▶ the other role takes the same engine,
                       endpoint, streams and wiring ─▶ reports resume under the new role

The paper's flip changes an internal role variable once the instance has
drained, and never reloads the model. Here the engine's scheduler changes class
on the engine thread (``assume`` in each role's ``vllm_scheduler.py``), the
worker's role object is swapped, and the rest — loaded weights, KV cache,
transport endpoint, the front doors' open streams — stays as it is. A flip
whose drain timed out first ends what is still here with ``retry`` errors, so
the front doors migrate those requests with the tokens they have.

Calls meant for the other role (a placement or handoff decided from a view
taken before the flip) are refused the way that role refuses: a prompt gets a
``retry`` error on its stream, a handoff is declined.

The Ray dashboard lists each worker as ``Worker(<role> <name>, ...)`` (``__repr__``)
only as it was when the actor was created; ``status`` shows the current role,
lifecycle, flips and the last flip's times.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tetriserve.channel import core
from tetriserve.channel.handoff import HANDOFF_MESSAGES
from tetriserve.channel.intake import INTAKE_MESSAGES, IntakeMessage, Submit
from tetriserve.common.config import ClusterConfig
from tetriserve.common.gc_heap import freeze_heap
from tetriserve.common.length import LengthEstimate, LengthPredictor
from tetriserve.common.load import DecodeLoad, PrefillLoad, Role
from tetriserve.common.request import Request
from tetriserve.common.stream import FinishReason, Heartbeat
from tetriserve.decode_worker.moves import DecodePeer
from tetriserve.decode_worker.slices import Order
from tetriserve.decode_worker.worker import DecodeWorker
from tetriserve.engine.ray_api import MonitorHandle, SchedulerHandle, node_ip_address
from tetriserve.engine.worker_base import EngineWorker, serve_subscriber
from tetriserve.observability import tracing
from tetriserve.prefill_worker.decode_peers import DecodeHandle
from tetriserve.prefill_worker.worker import PrefillWorker
from tetriserve.worker.colocated import ColocatedWorker

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.002


@dataclass(frozen=True)
class FlipResult:
    """What a flip took: ``switch_ms`` from the role being idle to the new role taking the engine (the
    paper's 5–7 ms), ``wait_ms`` waiting for it to be idle (after the drain, or after evicting)."""

    role: str
    switch_ms: float
    wait_ms: float
    evicted: int
    load: PrefillLoad | DecodeLoad  # the first in the new role, for the monitor's registration


class Worker:
    def __init__(
        self,
        worker_id: str,
        config: ClusterConfig,
        model_path: str,
        predictor: LengthPredictor,
        role: str,
        incarnation: int = 0,
    ) -> None:
        tracing.setup_process(config.tracing, worker_id)  # spans and request ids on log lines, per process
        self.worker_id, self.config, self.model_path, self.predictor = worker_id, config, model_path, predictor
        self.role: EngineWorker = self._make(Role(role), incarnation, None)
        self.flips = 0
        self._flipping = False
        self._heap_frozen = False
        # subscribed front door -> the link of its intake
        self._intakes: dict[str, core.Link[IntakeMessage] | None] = {}
        # prefill workers' handoff calls: (address, token) of the endpoint, and the task serving it
        self._handoff: tuple[tuple[str, str], asyncio.Task[None]] | None = None

    def __repr__(self) -> str:
        return f"Worker({self.role_name} {self.worker_id}, flips={self.flips})"

    @property
    def role_name(self) -> str:
        if isinstance(self.role, ColocatedWorker):
            return "colocated"
        return "prefill" if isinstance(self.role, PrefillWorker) else "decode"

    def _make(self, role: Role, incarnation: int, predecessor: EngineWorker | None) -> EngineWorker:
        if role is Role.COLOCATED:
            return ColocatedWorker(self.worker_id, self.config, self.model_path, self.predictor, incarnation)
        if role is Role.PREFILL:
            return PrefillWorker(self.worker_id, self.config, self.model_path, self.predictor, incarnation, predecessor)
        return DecodeWorker(self.worker_id, self.config, self.model_path, incarnation, predecessor)

    # -- the flip ------------------------------------------------------------------------
    async def flip(self, role: str, timeout_s: float = 30.0) -> FlipResult:
        """Serve ``role`` with the engine this worker has. Called once the worker has drained; requests still
        here (a drain that timed out) get ``retry`` errors first. A ValueError: already that role, or busy."""
        target = Role(role)
        if Role.COLOCATED in (target, Role(self.role_name)):
            raise ValueError(f"{self.worker_id}: a colocated worker runs both phases and has no other role")
        if target.value == self.role_name:
            raise ValueError(f"{self.worker_id} is a {role} worker already")
        if self._flipping:
            raise ValueError(f"{self.worker_id} is flipping already")
        self._flipping = True
        try:
            return await self._flip(target, timeout_s)
        finally:
            self._flipping = False

    async def _flip(self, target: Role, timeout_s: float) -> FlipResult:
        old = self.role
        t0 = time.perf_counter()
        evicted = 0
        if not old.idle():
            evicted = old.evict(f"{self.worker_id} is changing role to {target.value}; the request goes on elsewhere")
        deadline = time.monotonic() + timeout_s
        while not old.idle():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.worker_id}: still busy after {timeout_s:g} s; not flipped")
            await asyncio.sleep(IDLE_POLL_S)
        t1 = time.perf_counter()
        old.retire()
        new = self._make(target, old.incarnation, old)  # the engine is idle: its thread takes the role at once
        self.role = new
        self.flips += 1
        t2 = time.perf_counter()
        await new.resume()
        result = FlipResult(target.value, (t2 - t1) * 1000, (t1 - t0) * 1000, evicted, new.load())
        logger.info("worker %s: now %s (%s)", self.worker_id, target.value, result)
        return result

    # -- what every worker serves ------------------------------------------------------------
    async def start(self, monitor: MonitorHandle, scheduler: SchedulerHandle | None = None) -> str:
        """Begin (or redirect) reports. The length predictor loads off this path, on a prefill role's prediction
        thread (``prefill_worker/predictions.py``): a decode worker never loads it, a prefill worker serves while
        it loads (handoffs take the instant estimate until then), and a flip to prefill never waits for it."""
        if not self._heap_frozen:
            freeze_heap(f"worker {self.worker_id}")  # its engine and role are built (common/gc_heap.py)
            self._heap_frozen = True
        return await self.role.start(monitor, scheduler)

    async def sentinel(self) -> None:
        await asyncio.Event().wait()

    async def subscribe(self, subscriber: str, address: str) -> AsyncIterator[Heartbeat]:
        """The front door's one stream from this worker: it outlives flips (the streams are the worker's). A
        newer subscription of the same front door takes over from an open one, which then ends; the intake the
        newer one attached stays."""
        self._intakes.setdefault(subscriber, None)
        try:
            async for heartbeat in serve_subscriber(lambda: self.role, subscriber, address):
                yield heartbeat
        finally:
            if not self.role.streams.attached(subscriber):
                self._detach(subscriber)

    def attach_intake(self, subscriber: str, address: str, route: bytes) -> bool:
        """While its subscription lasts, the front door ``subscriber``'s submits and aborts come over ZeroMQ from
        its intake at ``address`` (``channel/intake.py``); False when it has no subscription open here."""
        if subscriber not in self._intakes:
            return False
        self._detach(subscriber)

        def deliver(message: IntakeMessage) -> None:
            if isinstance(message, Submit):
                self.submit(message.request, subscriber)
            else:
                self.abort(message.request_id, message.attempt)

        self._intakes[subscriber] = core.Link(
            address, route, f"intake from {subscriber}", accepts=INTAKE_MESSAGES, on_message=deliver
        )
        return True

    def _detach(self, subscriber: str) -> None:
        link = self._intakes.pop(subscriber, None)
        if link is not None:
            link.close()

    def handoff_address(self) -> tuple[str, str]:
        """(address, token) of this worker's handoff endpoint (``channel/handoff.py``), bound on first ask: a
        prefill worker's ``take``, ``pull_kv``, ``refine``, ``discard`` and ``kv_failed`` come over it, each
        calling this actor's method of that name."""
        if self._handoff is None:
            token = secrets.token_hex(16)
            endpoint = core.Endpoint(
                node_ip_address(), f"handoff to {self.worker_id}", HANDOFF_MESSAGES, token.encode()
            )
            serving = asyncio.get_running_loop().create_task(endpoint.serve(functools.partial(core.invoke, self)))
            self._handoff = (endpoint.address, token), serving
        return self._handoff[0]

    def ping(self) -> bool:
        """For a caller waiting on this worker over another channel: raises (Ray's ``ActorDiedError``) once it
        is dead."""
        return True

    def stats(self) -> dict[str, object]:
        return {**self.role.stats(), "role": self.role_name, "flips": self.flips}

    def policies(self) -> dict[str, str]:
        return self.role.policies()

    async def set_policy(self, changes: dict[str, object]) -> dict[str, str]:
        return await self.role.set_policy(changes)

    def abort(self, request_id: str, attempt: int | None = None) -> bool:
        return self.role.abort(request_id, attempt)

    def discard(self, key: str) -> None:
        """Drop KV pushed for a request that will not decode here (finished at prefill, aborted)."""
        self.role.endpoint.discard(key)

    # -- prefill ---------------------------------------------------------------------------
    def submit(self, req: Request, subscriber: str) -> None:
        if isinstance(self.role, (PrefillWorker, ColocatedWorker)):
            self.role.submit(req, subscriber)
        else:
            error = f"{self.worker_id} serves decode now"
            self.role.publish(subscriber, req, (), FinishReason.ERROR, error, index=len(req.resume), retry=True)

    def update_decode_view(
        self, loads: list[DecodeLoad], addresses: dict[str, str], handles: dict[str, DecodeHandle]
    ) -> None:
        if isinstance(self.role, PrefillWorker):
            self.role.update_decode_view(loads, addresses, handles)

    def observe_many(self, lengths: list[tuple[int, int]]) -> None:
        """Finished requests' (prompt, output) lengths, for the length predictor (whatever role the worker plays
        now); the GlobalScheduler sends them many to a call."""
        for prompt_len, output_len in lengths:
            self.predictor.observe(prompt_len, output_len)

    # -- decode ----------------------------------------------------------------------------
    async def take(
        self,
        request: Request,
        generated: tuple[int, ...],
        subscriber: str,
        pull_from: str | None = None,
        prefill_here: bool = False,
    ) -> bool:
        if not isinstance(self.role, DecodeWorker):
            return False
        return await self.role.take(request, generated, subscriber, pull_from, prefill_here)

    async def adopt(self, req: Request, generated: tuple[int, ...], key: str, subscriber: str) -> bool:
        return isinstance(self.role, DecodeWorker) and await self.role.adopt(req, generated, key, subscriber)

    async def refine(self, request_id: str, attempt: int, estimate: LengthEstimate) -> bool:
        return isinstance(self.role, DecodeWorker) and await self.role.refine(request_id, attempt, estimate)

    def pull_kv(self, src: str, key: str) -> None:
        """A prefill worker on this host published ``key``'s KV: take it from there, one-sided, as it comes."""
        self.role.pull_kv(src, key)

    def kv_failed(self, key: str, error: str) -> None:
        """The prefill worker's send of ``key`` failed: the engine's load of it fails now, not at its deadline."""
        self.role.endpoint.fail(key, error)

    async def rebalance(self, order: Order, address: str, handle: DecodePeer) -> list[str]:
        return await self.role.rebalance(order, address, handle) if isinstance(self.role, DecodeWorker) else []
