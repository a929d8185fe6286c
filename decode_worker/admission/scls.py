"""SCLS admission: serving time-oriented batching (SCLS §4.4, Algorithm 1, eq. 10) over the waiting requests,
with the memory estimator's no-OOM test (§4.3, eq. 9) for a slice of S tokens. Pure.

Algorithm 1 sorts the requests by input length, ascending, and finds the partition into contiguous batches
with the least total serving time:

    T[0] = 0,   T[i] = min_{0 < j ≤ i} ( T[j−1] + T_serve(i−j+1, L_i, S) )                  (eq. 10)

where L_i, the i-th request's input length, is its batch's padded length (the longest, by the sort), j runs
down from i − 1 while the batch of i − j + 1 requests passes OOM (the memory estimator), and a request alone
is always a batch. T_serve is the serving-time estimator (eq. 1–4, ``common/scls_estimators.py``).

On a continuously batched engine, at each step:

* ``order`` runs Algorithm 1 over the waiting requests whenever they changed since the step before (one
  arrived, one was admitted, or the KV pool changed size), a request's input length being its context now
  (prompt plus the tokens it has so far, what SCLS would recompute). OOM counts the KV the running batch
  holds through its own next slice, Σ (context + min(S, tokens it may still generate)), against ζ·M_ava,
  where M_ava is the engine's KV pool (what its running and waiting requests hold plus what is free: eq. 6
  as vLLM sized it), in tokens (Δ = 1). Of the batches, the one with the longest estimated serving time
  goes first, as SCLS's max-min offloader hands batches out (§4.5); its members come first in the order,
  by arrival, then every other waiting request, by arrival.
* ``admit`` takes the members of that batch while they fit the free KV now; the first request outside it,
  or a member that would run out of KV, holds everyone after it until the next step, when the batching
  runs again over what is still waiting. An empty engine admits whatever fits now, so a request larger
  than ζ·M_ava still runs, alone.

Counted decisions (``Decisions("scls")``), each against vLLM's arrival-order greedy admission: per run of
the batching, ``split`` (the waiting requests form more than one batch) and ``reordered`` (the batch chosen
is not the head of the arrival order); per step, ``held`` (a request that fits the free KV now is held
back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from tetriserve.common.decisions import Decisions
from tetriserve.common.scls_estimators import ZETA, MemoryEstimator, ServingTime
from tetriserve.decode_worker.views import DecodeReqView, DecodeState

Cost = Callable[[int, int, int], float]  # T_serve(N, L_i, S)
Oom = Callable[[int, int, int], bool]  # OOM(N, L_i, S)


def serving_time_batches(lengths: Sequence[int], s: int, t_serve: Cost, oom: Oom) -> tuple[list[list[int]], float]:
    """Algorithm 1 over requests of input ``lengths``: the batches, as indices into ``lengths`` (each batch
    ascending by length, the batches from the longest inputs to the shortest, as the algorithm appends
    them), and their least total serving time T[n]."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])  # line 1; stable, so ties keep their order
    n = len(order)
    total = [0.0] * (n + 1)  # T
    split = [0] * (n + 1)  # P
    for i in range(1, n + 1):
        split[i] = i - 1  # a batch of its own
        li = lengths[order[i - 1]]
        total[i] = total[i - 1] + t_serve(1, li, s)
        j = i - 1
        while j > 0 and not oom(i - j + 1, li, s):
            t = total[j - 1] + t_serve(i - j + 1, li, s)
            if t < total[i]:
                total[i] = t
                split[i] = j - 1
            j -= 1
    batches: list[list[int]] = []
    i = n
    while i > 0:
        p = split[i]
        batches.append(order[p:i])
        i = p
    return batches, total[n]


class SclsAdmission:
    name: ClassVar[str] = "scls"

    def __init__(self, slice_iters: int = 128, zeta: float = ZETA, serving: ServingTime | None = None) -> None:
        if slice_iters < 1:
            raise ValueError(f"scls admission: the slice length S must be >= 1, got {slice_iters}")
        if not 0 < zeta <= 1:
            raise ValueError(f"decode.admission.zeta: must be in (0, 1], got {zeta}")
        self.slice_iters = slice_iters
        self.zeta = zeta
        self.serving = serving if serving is not None else ServingTime()
        self.decisions = Decisions(self.name)
        self._batch: frozenset[str] = frozenset()
        self._fits = True
        self._key: tuple[tuple[tuple[str, int], ...], int] | None = None  # the waiting requests batched last
        self._first: list[int] = []  # of them, the batch to admit first (indices in arrival order)

    def running_kv(self, state: DecodeState) -> int:
        """Tokens of KV the running batch holds at the end of its next slice."""
        s = self.slice_iters
        return sum(r.context + min(s, max(0, r.max_tokens - r.generated)) for r in state.running)

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        arrival = sorted(waiting, key=lambda r: (r.arrival_time, r.request_id))
        s = self.slice_iters
        pool = state.capacity + sum(r.held_blocks for r in arrival)
        mem = MemoryEstimator(m_ava=float(pool * state.block_size), zeta=self.zeta)
        used = float(self.running_kv(state))
        key = (tuple((r.request_id, r.context) for r in arrival), pool)
        if key != self._key:
            self._key = key
            self._first = self._batching(arrival, mem, used)
        first = self._first
        self._batch = frozenset(arrival[k].request_id for k in first)
        li = max((arrival[k].context for k in first), default=0)
        self._fits = not state.running or mem.fits(len(first), li, s, used)
        chosen = set(first)
        return [arrival[k] for k in first] + [r for k, r in enumerate(arrival) if k not in chosen]

    def _batching(self, arrival: list[DecodeReqView], mem: MemoryEstimator, used: float) -> list[int]:
        """Algorithm 1 over the waiting requests (in arrival order): the batch to admit first, ascending."""
        if not arrival:
            return []
        s = self.slice_iters
        lengths = [r.context for r in arrival]
        batches, _ = serving_time_batches(lengths, s, self.serving.t_serve, lambda n, li, sl: mem.oom(n, li, sl, used))

        def longest(b: list[int]) -> tuple[float, int]:  # the longest serving time; a tie to the oldest member
            return self.serving.t_serve(len(b), max(lengths[k] for k in b), s), -min(b)

        chosen: list[int] = max(batches, key=longest)
        first = sorted(chosen)
        if len(batches) > 1:
            self.decisions.count("split")
        if first != list(range(len(first))):
            self.decisions.count("reordered")
        return first

    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        if req.request_id in self._batch and self._fits and state.fits_now(req):
            return True
        if state.fits_now(req):
            self.decisions.count("held")
        return False
