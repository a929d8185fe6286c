"""Prefix-aware placement: send a prompt to the prefill worker that likely holds its longest prefix, when that
saves more time than the queue it waits behind costs.

The GlobalScheduler sees no engine's cache, so it keeps an estimate (``PrefixIndex``): per prefill worker, the
block hashes (``common/prefix_blocks.py``) of the prompts it placed there, least recently placed first, bounded
by the blocks the worker's KV cache holds (its load report's ``total_kv_blocks``; ``DEFAULT_BLOCKS`` until it
has reported one). A prompt's expected hit on a worker is the number of its leading hashes the worker's set
holds, times the block size. The estimate forgets a worker that restarts or leaves (its cache is gone) and can
be wrong both ways: the engine may have evicted blocks sooner (other prompts' KV, or decode-side use of a
colocated worker), and a prompt that was placed may have failed before it was cached.

The choice (``prefer``), among the workers with room (the admission bound already holds: none of them would
make the request wait longer than ``admission.max_wait_s``): start from the least-loaded worker ``b``, the one
placement without prefixes takes; a worker ``w`` with a longer expected hit saves the compute of the extra
cached tokens and costs the difference of the queues,

    gain(w) = (hit(w) − hit(b)) · s(w) − (wait(w) − wait(b))

with ``s`` the worker's reported seconds per prompt token and ``wait`` its expected queue wait; the worker of
the largest positive gain is taken, else ``b``. Equal hits (a workload of unrelated prompts, or a system prompt
every worker holds) leave least-load's choice as it is. Where no worker has a measured pace (``s`` is 0 before
a worker has prefilled for ``pace.MIN_MEASURED_S``), the pace of the others is used, and with none at all the
longest hit wins, as the queues are not priced either.

Pure (no Ray, no vLLM); ``control_plane/global_scheduler.py`` holds one and calls it per placement.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_BLOCKS = 4096  # a worker's capacity in blocks until its load report gives one


@dataclass(frozen=True)
class Queue:
    """What ``prefer`` reads of a candidate: its expected queue wait and its pace."""

    wait_s: float
    seconds_per_token: float


@dataclass(frozen=True)
class Choice:
    worker: str
    hit_tokens: int  # the expected hit on the chosen worker
    by_prefix: bool  # a longer hit moved the request off least-load's choice


class PrefixIndex:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    def capacity(self, worker: str, blocks: int) -> None:
        """The worker's KV cache holds ``blocks`` (from its load report); 0: unknown."""
        if blocks > 0:
            self._capacity[worker] = blocks
            self._trim(worker)

    def forget(self, worker: str) -> None:
        """The worker restarted or left: its cache is gone."""
        self._blocks.pop(worker, None)
        self._capacity.pop(worker, None)

    def hit(self, worker: str, hashes: Sequence[int]) -> int:
        """Leading ``hashes`` the worker is expected to hold, in tokens."""
        held = self._blocks.get(worker)
        if not held:
            return 0
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n * self.block_size

    def placed(self, worker: str, hashes: Sequence[int]) -> None:
        """A prompt of ``hashes`` went to ``worker``: its blocks are its most recent."""
        held = self._blocks.setdefault(worker, OrderedDict())
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        self._trim(worker)

    def held(self, worker: str) -> int:
        """Blocks the worker is expected to hold."""
        return len(self._blocks.get(worker, ()))

    def _trim(self, worker: str) -> None:
        held = self._blocks.get(worker)
        if held is None:
            return
        cap = self._capacity.get(worker, DEFAULT_BLOCKS)
        while len(held) > cap:
            held.popitem(last=False)

    def prefer(
        self, base: str, candidates: Sequence[str], hashes: Sequence[int], queues: Mapping[str, Queue]
    ) -> Choice:
        """The worker to place a prompt of ``hashes`` on, from least-load's choice ``base`` (module docstring)."""
        hits = {w: self.hit(w, hashes) for w in candidates}
        measured = [queues[w].seconds_per_token for w in candidates if queues[w].seconds_per_token > 0]
        fallback = max(measured, default=0.0)
        best, best_gain = base, 0.0
        for w in candidates:
            extra = hits[w] - hits[base]
            if w == base or extra <= 0:
                continue
            pace = queues[w].seconds_per_token or fallback
            gain = extra * pace - (queues[w].wait_s - queues[base].wait_s) if pace > 0 else float(extra)
            if gain > best_gain:
                best, best_gain = w, gain
        return Choice(best, hits[best], best != base)
