"""SCLS slice rebalancing for continuously batched decode workers (SCLS §4.5, §4.6 eq. 12, §7). Pure.

SCLS serves static batches slice by slice and, at every slice, offloads the batch
with the longest estimated serving time to the least-loaded worker (max-min,
§4.5). §7 carries the idea over to continuous batching: limit what a request
generates per schedule to a slice of S iterations, so that at a slice boundary a
long request can be rescheduled on an instance with more room. Here a request
that is *not* moved simply runs on (continuous batching needs no restart); one
that is moved ships its KV to the other worker instead of recomputing it.

    every T seconds (ClusterMonitor)       plan(loads)          ─▶ Order(src, dst, loads in seconds)
    on the source decode worker             pick_movers(running) ─▶ requests to move at their next boundary
    after each round                        next_interval(loads) ─▶ T ← max(λ·min_w T_load(w), Γ)   (eq. 12)

Γ is given in decode iterations (the paper's 6 s and 3 s are about one 128-iteration slice on its engines,
§5.1, Fig. 11): Γ = that many steps at the decode workers' median step time, or a number of seconds while
no worker reports a step time.

A worker's load ``T_load`` is its predicted remaining tokens (running and queued)
times its current cost per token (decode step time / batch size): the time to
drain what it holds at its current speed. A worker that is not decoding has no
cost of its own and is priced at the median of the others'.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from tetriserve.common.load import DecodeLoad
from tetriserve.decode_worker.views import DecodeReqView, blocks_for


@dataclass(frozen=True)
class Order:
    """Move work from ``src`` to ``dst`` at slice boundaries while that narrows the gap between them."""

    src: str
    dst: str
    src_load_s: float
    dst_load_s: float
    src_token_s: float  # cost of one generated token on each side
    dst_token_s: float
    dst_free_blocks: int
    block_size: int


def token_cost_s(load: DecodeLoad) -> float | None:
    """Seconds per generated token on ``load``'s worker now, or None while it is not decoding."""
    if load.running <= 0 or load.step_s <= 0:
        return None
    return load.step_s / load.running


def token_costs(loads: Sequence[DecodeLoad]) -> dict[str, float]:
    """Every worker's cost per token; idle ones at the median of the known costs (1.0 when none is known,
    which leaves loads in tokens: the comparison between workers is all that matters then)."""
    known = {ld.worker_id: c for ld in loads if (c := token_cost_s(ld)) is not None}
    fallback = statistics.median(known.values()) if known else 1.0
    return {ld.worker_id: known.get(ld.worker_id, fallback) for ld in loads}


def load_s(load: DecodeLoad, cost: float) -> float:
    """T_load(w): the time to serve what the worker holds (§4.5)."""
    return load.remaining_tokens * cost


def plan(loads: Sequence[DecodeLoad]) -> list[Order]:
    """Max-min pairing (§4.5): the most loaded worker that slices gives to the least loaded accepting one,
    the second most to the second least, and so on; each worker takes part in at most one order."""
    costs = token_costs(loads)
    seconds = {ld.worker_id: load_s(ld, costs[ld.worker_id]) for ld in loads}
    by_load = sorted(loads, key=lambda ld: (seconds[ld.worker_id], ld.worker_id))
    sources = [ld for ld in reversed(by_load) if ld.slice_iters > 0 and ld.running > 0]
    dests = [ld for ld in by_load if ld.accepting]
    orders: list[Order] = []
    used: set[str] = set()
    for src in sources:
        if src.worker_id in used:
            continue
        dst = next((d for d in dests if d.worker_id not in used and d.worker_id != src.worker_id), None)
        if dst is None or seconds[dst.worker_id] >= seconds[src.worker_id]:
            break
        used |= {src.worker_id, dst.worker_id}
        s, d = src.worker_id, dst.worker_id
        orders.append(Order(s, d, seconds[s], seconds[d], costs[s], costs[d], dst.free_kv_blocks, dst.block_size))
    return orders


def min_interval(loads: Sequence[DecodeLoad], gamma_s: float, gamma_iters: int = 0) -> float:
    """Eq. 12's Γ: ``gamma_iters`` steps at the median step time of the workers that report one; ``gamma_s``
    seconds while none does, or where ``gamma_iters`` is 0."""
    steps = [ld.step_s for ld in loads if ld.step_s > 0]
    if gamma_iters <= 0 or not steps:
        return gamma_s
    return gamma_iters * statistics.median(steps)


def next_interval(loads: Sequence[DecodeLoad], lam: float, gamma_s: float, gamma_iters: int = 0) -> float:
    """Eq. 12: T ← max(λ · min_w T_load(w), Γ), Γ from ``min_interval``; Γ while no worker's time per token
    is known (loads are then in tokens, not seconds)."""
    gamma = min_interval(loads, gamma_s, gamma_iters)
    if not any(token_cost_s(ld) is not None for ld in loads):
        return gamma
    costs = token_costs(loads)
    return max(lam * min(load_s(ld, costs[ld.worker_id]) for ld in loads), gamma)


def pick_movers(running: Sequence[DecodeReqView], order: Order, slice_iters: int) -> list[str]:
    """Requests of ``order.src`` to move, longest predicted remaining first (max-min).

    One moves only if it will not finish within the next slice anyway, its KV is not in flight,
    its context fits the destination's free KV, and after the move the destination is still less
    loaded than the source (so the gap narrows and the next round cannot send it back).
    """
    src, dst, free = order.src_load_s, order.dst_load_s, order.dst_free_blocks
    picked: list[str] = []
    for view in sorted(running, key=lambda v: (-v.predicted_remaining("estimate"), v.request_id)):
        remaining = view.predicted_remaining("estimate")
        if remaining <= slice_iters:
            break  # sorted: nobody after it is long-running either
        need = blocks_for(view.context + slice_iters, order.block_size)
        if view.transferring or need > free:
            continue
        to_src, to_dst = remaining * order.src_token_s, remaining * order.dst_token_s
        if dst + to_dst >= src - to_src:
            continue
        picked.append(view.request_id)
        src, dst, free = src - to_src, dst + to_dst, free - need
    return picked


@dataclass
class SliceMoves:
    """A decode worker's slice moves: sent on, taken over, and kept because the destination refused."""

    moved_out: int = 0
    moved_in: int = 0
    kept: int = 0

    def summary(self) -> dict[str, str]:
        return {f"slice_{f.name}": str(getattr(self, f.name)) for f in fields(self)}
