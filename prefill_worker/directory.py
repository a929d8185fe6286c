"""The decode workers as one prefill worker sees them (TetriInfer §3.2-§3.3.3): their loads from the
ClusterMonitor's broadcast, debited locally between broadcasts so that a burst does not herd onto one
(``dispatch/base.account``); their handoff addresses; the peer of each one's current life (``decode_peers.py``);
the lives a call of ours found dead. The dispatcher chooses among them (power-of-two by default, §3.3.3).

A life found dead (``died``) leaves dispatch at once and the monitor is told, so its next broadcast drops it for
every prefill worker before the supervisor has noticed; broadcasts of that life already on their way are ignored
until a later incarnation comes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.decode_peers import DecodeHandle, DecodePeer
from tetriserve.prefill_worker.dispatch.base import DispatchPolicy, accepting, account
from tetriserve.prefill_worker.views import ReqView


class DecodeDirectory:
    def __init__(
        self,
        worker_id: str,
        dispatcher: DispatchPolicy,
        rng: random.Random,
        heavy_threshold_tokens: int,
        mark_dead: Callable[[str, int], None],
    ) -> None:
        """``mark_dead(decode id, incarnation)`` tells the monitor of a life found dead."""
        self.worker_id, self.dispatcher, self.rng = worker_id, dispatcher, rng
        self.heavy_threshold_tokens = heavy_threshold_tokens
        self._mark_dead = mark_dead
        self.loads: dict[str, DecodeLoad] = {}
        self.addresses: dict[str, str] = {}
        self._peers: dict[str, DecodePeer] = {}
        self._dead: dict[str, int] = {}  # decode id -> the incarnation a call of ours found dead

    def update(
        self, loads: list[DecodeLoad], addresses: Mapping[str, str], handles: Mapping[str, DecodeHandle]
    ) -> None:
        """A broadcast: the loads of the decode workers that serve now, and the addresses and handles of those not
        seen in their current life (each new life gets a peer, with a link of its own)."""
        self.loads = {ld.worker_id: ld for ld in loads if not self._found_dead(ld)}
        self.addresses.update(addresses)
        for decode_id, handle in handles.items():
            old = self._peers.get(decode_id)
            if old is not None:
                old.close()
            self._peers[decode_id] = DecodePeer(decode_id, handle, self.worker_id)

    def _found_dead(self, load: DecodeLoad) -> bool:
        dead = self._dead.get(load.worker_id)
        if dead is not None and load.incarnation > dead:
            del self._dead[load.worker_id]
            return False
        return dead is not None

    def peer(self, decode_id: str) -> DecodePeer | None:
        return self._peers.get(decode_id)

    def address(self, decode_id: str) -> str:
        """``decode_id``'s handoff address ("" while unknown)."""
        return self.addresses.get(decode_id, "")

    def died(self, decode_id: str) -> None:
        """A call of ours found ``decode_id``'s current life dead (told to the monitor once per life)."""
        known = self.loads.pop(decode_id, None)
        if known is None:  # found already, or no longer in the view: not ours to judge
            return
        self._dead[decode_id] = known.incarnation
        peer = self._peers.get(decode_id)
        if peer is not None:  # a later life comes with a peer of its own
            peer.close()
        self._mark_dead(decode_id, known.incarnation)

    def forget(self, decode_id: str) -> None:
        """Leave ``decode_id`` out of dispatch until the next broadcast lists it (a send to it broke off)."""
        self.loads.pop(decode_id, None)

    def accepting(self) -> int:
        """How many decode workers accept requests now."""
        return len(accepting(list(self.loads.values())))

    def pick(self, view: ReqView) -> str | None:
        """A decode worker for ``view`` now, if the dispatcher finds one (accounted for in the local view)."""
        choice = self.dispatcher.choose(view, list(self.loads.values()), self.rng)
        if choice is None or choice not in self.addresses:
            return None
        self.account(choice, view)
        return choice

    async def choose(self, view: ReqView, timeout_s: float, poll_s: float) -> str | None:
        """A decode worker for ``view``; while none serves (all restarting), wait up to ``timeout_s``, looking
        every ``poll_s`` (the broadcast's interval), rather than give the request up."""
        deadline = time.monotonic() + timeout_s
        while (choice := self.pick(view)) is None:
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(poll_s)
        return choice

    def prompt_room(self, view: ReqView) -> str | None:
        """The decode worker with the most room to compute ``view``'s prompt (its ``prompt_room``,
        ``decode.max_local_prompts``, by the broadcast loads less the offers made since), the room taken; None:
        none has room."""
        room = [d for d in self.loads.values() if d.accepting and d.prompt_room > 0 and d.worker_id in self._peers]
        if not room:
            return None
        decode_id = min(room, key=lambda d: (-d.prompt_room, d.running + d.queued, d.worker_id)).worker_id
        self.account(decode_id, view)
        offered = self.loads[decode_id]
        self.loads[decode_id] = replace(offered, prompt_room=offered.prompt_room - 1)
        return decode_id

    def account(self, decode_id: str, view: ReqView) -> None:
        """Debit the local copy of ``decode_id``'s load for ``view``, until the next broadcast."""
        self.loads[decode_id] = account(self.loads[decode_id], view, self.heavy_threshold_tokens)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
