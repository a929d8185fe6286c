"""The front door's log of one request's delivered tokens: chunks from any worker in, one ordered stream out.

A request's tokens come from several workers (the first from its prefill
worker, the rest from its decode worker, and from another decode worker after
an SCLS slice move), each over its own stream, so they may arrive out of order.
Every chunk says where its tokens sit in the output (``index``) and which
placement ``attempt`` produced them::

    add(chunk) ─▶ stale attempt?            drop
               ─▶ moved_to marker?           note where the request is now (for aborts)
               ─▶ index > delivered?         hold until the tokens before it arrive
               ─▶ overlaps what was sent?    drop the duplicate prefix
               ─▶ otherwise                  deliver, then whatever held chunk now fits, up to a finish

A worker's finish, whatever its reason, waits for the tokens before it (the
workers before it published them first, so they are on their way); a finish
the front door makes itself (abort, a lost stream) has index ``AT_ONCE`` and
ends the stream now. The log is
the truth of what the client has received: ``tokens`` is exactly that. When a
request migrates after a failure, ``restart`` starts its next attempt from
those tokens: what the old attempt still had on its way is dropped as stale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tetriserve.common.stream import StreamChunk

logger = logging.getLogger(__name__)

AT_ONCE = -1  # the index of a finish the front door makes itself (abort, lost stream): it ends the stream now


@dataclass
class LogStats:
    duplicates: int = 0  # tokens received more than once and dropped
    stale: int = 0  # chunks of another attempt, dropped


class TokenLog:
    def __init__(self, request_id: str, worker: str = "", attempt: int = 0) -> None:
        self.request_id = request_id
        self.attempt = attempt
        self.tokens: list[int] = []
        self.finish: StreamChunk | None = None
        self.stats = LogStats()
        self._held: list[StreamChunk] = []
        self._where: tuple[tuple[int, int], str] = ((-1, 0), worker)  # (evidence key, worker) of the newest

    def restart(self, attempt: int, worker: str) -> None:
        """Follow attempt ``attempt``, placed on ``worker``, from the tokens delivered so far."""
        if attempt < self.attempt:
            raise ValueError(f"request {self.request_id}: attempt {attempt} is older than {self.attempt}")
        self.attempt = attempt
        self._held = []
        self._where = ((len(self.tokens) - 1, 0), worker)

    @property
    def worker(self) -> str:
        """The worker the request is on now, as far as the chunks so far tell."""
        return self._where[1]

    @property
    def done(self) -> bool:
        return self.finish is not None

    def add(self, chunk: StreamChunk) -> list[StreamChunk]:
        """Take one chunk; return what can be delivered now, in order (the last may be the finish)."""
        if self.done:
            return []
        if chunk.attempt != self.attempt:
            self.stats.stale += 1
            logger.debug("request %s: dropped a chunk of attempt %d", self.request_id, chunk.attempt)
            return []
        if chunk.moved_to is not None:
            self._locate((chunk.index, 1), chunk.moved_to)
            return []
        if chunk.token_ids:
            self._locate((chunk.index, 0), chunk.worker)
        self._held.append(chunk)
        out: list[StreamChunk] = []
        while (ready := self._next_ready()) is not None:
            out.append(ready)
            if ready.finished:
                self.finish = ready
                break
        return out

    def _locate(self, key: tuple[int, int], worker: str) -> None:
        if worker and key >= self._where[0]:
            self._where = (key, worker)

    def _next_ready(self) -> StreamChunk | None:
        """Pop a held chunk that starts at or before the end of what was delivered, trimmed to the new part."""
        sent = len(self.tokens)
        for i, chunk in enumerate(self._held):
            if chunk.index == AT_ONCE:
                del self._held[i]
                return replace(chunk, token_ids=(), index=sent)
            if chunk.index > sent:
                continue
            del self._held[i]
            skip = sent - chunk.index
            if skip >= len(chunk.token_ids) and not chunk.finished:
                self.stats.duplicates += len(chunk.token_ids)
                return self._next_ready()
            self.stats.duplicates += min(skip, len(chunk.token_ids))
            if skip == 0:  # in order, the usual case: the chunk as it came
                self.tokens.extend(chunk.token_ids)
                return chunk
            new = chunk.token_ids[skip:]
            self.tokens.extend(new)
            return replace(chunk, token_ids=new, index=sent)
        return None
