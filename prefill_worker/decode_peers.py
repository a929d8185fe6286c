"""A decode worker as a prefill worker calls it during the handoff, over the channel (``channel/handoff.py``).

A peer is made for each decode worker's life the ClusterMonitor's broadcast introduces (``update_decode_view``).
On its first use it asks that actor for its handoff endpoint's address and token in one Ray call and connects a
link; a ``take`` waits for that, and one-way messages sent meanwhile go, in order, once the link is up. A decode
worker that is dead by then fails the ``take`` with Ray's ``ActorDiedError``, as a Ray call on it would, and its
one-way messages are dropped with it. Every other failure of that call (a timeout, a worker still starting) fails
the ``take`` that waited for it, keeps the messages, and the next use asks again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Never, Protocol

from tetriserve.channel import core
from tetriserve.channel.handoff import Discard, KvFailed, PullKV, Refine, Take
from tetriserve.common.errors import actor_died
from tetriserve.engine.ray_api import AwaitedMethod, WorkerHandle

logger = logging.getLogger(__name__)

OneWay = PullKV | Refine | Discard | KvFailed


class DecodeHandle(WorkerHandle, Protocol):
    """The decode worker's actor handle, as the handoff calls it: once for the handoff endpoint, then for
    liveness; an abort of a request handed there follows it (``EngineWorker.forward_abort``)."""

    @property
    def handoff_address(self) -> AwaitedMethod[tuple[str, str]]: ...

    @property
    def ping(self) -> AwaitedMethod[object]: ...


class DecodePeer:
    """One decode worker's life, as this prefill worker's handoff calls it."""

    def __init__(self, decode_id: str, handle: DecodeHandle, caller: str) -> None:
        self.decode_id, self.handle, self.caller = decode_id, handle, caller
        self._pending: list[OneWay] = []  # sent before the link was up
        self._closed = False
        self._connecting: asyncio.Task[core.Link[Never]] | None = None

    async def take(self, message: Take) -> bool:
        """The decode worker's answer to ``message``; raises as a Ray call on it would (``ActorDiedError`` once it
        is dead), or ``core.PeerError`` (its ``take`` raised, or it did not answer)."""
        link = await asyncio.shield(self._connect())
        return bool(await link.call(message))

    def send(self, message: OneWay) -> None:
        """Send a one-way message (after every one sent before it); dropped once this life is over."""
        if self._closed:
            return
        connecting = self._connect()
        if not connecting.done():
            self._pending.append(message)
        elif (link := self._link()) is not None:
            link.send(message)

    def _connect(self) -> asyncio.Task[core.Link[Never]]:
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(self._opened)
        return self._connecting

    async def _open(self) -> core.Link[Never]:
        address, token = await self.handle.handoff_address.remote()
        route = b":".join((token.encode(), self.caller.encode(), secrets.token_hex(4).encode()))
        link: core.Link[Never] = core.Link(address, route, f"handoff to {self.decode_id}", self.handle.ping.remote)
        if self._closed:
            link.close()
        for message in self._pending:
            link.send(message)
        self._pending.clear()
        return link

    def _opened(self, connecting: asyncio.Task[core.Link[Never]]) -> None:
        exc = None if connecting.cancelled() else connecting.exception()
        if exc is None:
            return
        if actor_died(exc):
            logger.info("decode worker %s: no handoff link, it is dead (%s)", self.decode_id, type(exc).__name__)
            self._pending.clear()
        else:  # the next use asks again
            logger.warning("decode worker %s: no handoff link yet (%s: %s)", self.decode_id, type(exc).__name__, exc)
            self._connecting = None

    def close(self) -> None:
        """This life of the decode worker is over (a later one gets a peer of its own); a ``take`` still waiting on
        the link finds the actor dead on its next liveness probe."""
        self._closed = True
        self._pending.clear()
        link = self._link()
        if link is not None:  # one still connecting closes its link when it is up
            link.close()

    def _link(self) -> core.Link[Never] | None:
        """The link, if it is up."""
        connecting = self._connecting
        if connecting is None or not connecting.done() or connecting.cancelled() or connecting.exception():
            return None
        return connecting.result()
