"""The batch's KV peak under predicted lengths (TetriInfer §3.4 reserve-dynamic, SOLA §5.1, CacheOpt §3.3).

A batch of growing requests holds the most KV just before one of them finishes,
so checking the moments when members are predicted to finish covers the peak:

    usage(k) = Σ_{r ∈ members, rem_r ≥ k} blocks(context_r + k + pad)     (k steps from now)
    fits     ⇔ usage(k) ≤ capacity  for every k ∈ {0} ∪ {rem_r}

``remaining`` says how many more tokens each member is predicted to generate;
``pad`` tokens per member absorb small under-predictions (CacheOpt's buffer b).
``admits`` is the admission test built on it, shared by reserve-dynamic, SOLA and
CacheOpt: an empty batch admits whatever fits now, so a request larger than any
grant still runs (alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

Remaining = Callable[[DecodeReqView], int]


def peak_fits(
    members: tuple[DecodeReqView, ...],
    remaining: Remaining,
    capacity: int,
    block_size: int,
    horizons: Iterable[int] | None = None,
    pad: int = 0,
) -> bool:
    """Whether the members' KV stays within ``capacity`` at every horizon (by default: every predicted finish).

    One array operation over horizons × members: the admission policies ask this for every waiting request
    on every decode step, and with 8 running and 16 waiting the sum member by member (``peak_fits_by_sum``)
    costs 1.6–1.7 ms a step against 0.42–0.48 ms (``python benchmarks/diagnostics/decode_policy_cost.py``)."""
    rem = np.fromiter((remaining(r) for r in members), dtype=np.int64, count=len(members))
    ctx = np.fromiter((r.context for r in members), dtype=np.int64, count=len(members))
    ks = np.unique(np.fromiter(horizons, dtype=np.int64)) if horizons is not None else np.unique(np.append(rem, 0))
    if ks.size == 0:
        return True
    tokens = np.maximum(ctx[None, :] + ks[:, None] + pad, 0)
    blocks = -(-tokens // block_size)  # ceil, as blocks_for
    usage = np.where(rem[None, :] >= ks[:, None], blocks, 0).sum(axis=1)
    return bool((usage <= capacity).all())


def peak_fits_by_sum(
    members: tuple[DecodeReqView, ...],
    remaining: Remaining,
    capacity: int,
    block_size: int,
    horizons: Iterable[int] | None = None,
    pad: int = 0,
) -> bool:
    """``peak_fits`` as the module docstring defines it, summed member by member: its reference (the tests check
    one against the other, and the cost probe times both)."""
    ks = set(horizons) if horizons is not None else {remaining(r) for r in members} | {0}
    return all(
        sum(blocks_for(r.context + k + pad, block_size) for r in members if remaining(r) >= k) <= capacity for k in ks
    )


def admits(
    req: DecodeReqView,
    state: DecodeState,
    remaining: Remaining,
    *,
    reserve: int = 0,
    horizons: Iterable[int] | None = None,
    pad: int = 0,
) -> bool:
    """Whether the batch with ``req`` stays within the KV it may use, less ``reserve`` blocks, at its peak."""
    if not state.running:
        return state.fits_now(req)
    capacity = state.capacity + req.held_blocks - reserve
    return peak_fits((*state.running, req), remaining, capacity, state.block_size, horizons, pad)
