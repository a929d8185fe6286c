"""A decode worker as a prefill worker calls it during the handoff: over ZeroMQ
(``common/handoff_channel.py``) once its link is connected, over Ray before that, and for what the link does not
carry (``handle``: aborts forwarded, liveness).

A peer is made for each decode worker's life the ClusterMonitor's broadcast introduces (``update_decode_view``).
On its first call it asks that actor for its handoff server's address in one Ray call and connects; until the
answer is in, and for a decode worker of a release without the server, its calls go over Ray. A
request whose ``pull_kv`` went over Ray just before the link came up may reach the decode worker after its
``take`` did: the ``take`` then does not wait for the pull to settle, and the engine loads the KV once the pull
has landed it, as for a pushed KV.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tetriserve.common.handoff_channel import Discard, HandoffLink, KvFailed, PullKV, Refine
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request

logger = logging.getLogger(__name__)


class DecodePeer:
    """One decode worker's life, as this prefill worker's handoff calls it."""

    def __init__(self, decode_id: str, handle: Any, caller: str) -> None:
        self.decode_id, self.handle, self.caller = decode_id, handle, caller
        self.link: HandoffLink | None = None
        self._closed = False
        self._connecting: asyncio.Task[None] | None = None

    def _link(self) -> HandoffLink | None:
        """The link, once up and until closed (then Ray, whose call on a dead actor raises ``ActorDiedError`` as the
        handoff expects); the first call starts connecting it (on the caller's event loop)."""
        if self._closed:
            return None
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return self.link

    async def _connect(self) -> None:
        try:
            address, token = await self.handle.handoff_address.remote()
        except Exception as exc:  # dead already, or a release without the server: Ray it is
            logger.info("decode worker %s: no handoff link (%s); its calls go over Ray", self.decode_id, exc)
            return
        if not self._closed:
            self.link = HandoffLink(address, token.encode(), self.caller, self.handle.ping.remote)

    async def take(
        self,
        req: Request,
        generated: tuple[int, ...],
        estimate: LengthEstimate | None,
        subscriber: str,
        pull_from: str | None = None,
        prefill_here: bool = False,
    ) -> bool:
        """The decode worker's ``take``; raises as a Ray call on it would (``ActorDiedError`` once it is dead)."""
        link = self._link()
        if link is not None:
            return await link.take(req, generated, estimate, subscriber, pull_from, prefill_here)
        return bool(await self.handle.take.remote(req, generated, estimate, subscriber, pull_from, prefill_here))

    def pull_kv(self, src: str, key: str) -> None:
        if not self._sent(PullKV(src, key)):
            self.handle.pull_kv.remote(src, key)

    def refine(self, request_id: str, attempt: int, estimate: LengthEstimate) -> None:
        if not self._sent(Refine(request_id, attempt, estimate)):
            self.handle.refine.remote(request_id, attempt, estimate)

    def discard(self, key: str) -> None:
        if not self._sent(Discard(key)):
            self.handle.discard.remote(key)

    def kv_failed(self, key: str, error: str) -> None:
        if not self._sent(KvFailed(key, error)):
            self.handle.kv_failed.remote(key, error)

    def _sent(self, message: PullKV | Refine | Discard | KvFailed) -> bool:
        """Sent over the link; False: there is no link, the caller uses Ray."""
        link = self._link()
        if link is None:
            return False
        link.send(message)
        return True

    def close(self) -> None:
        """This life of the decode worker is over (a later one gets a peer of its own): later calls go over Ray,
        and a ``take`` still waiting on the link finds the actor dead on its next liveness probe."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self.link is not None:
            self.link.close()
