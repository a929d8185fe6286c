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

from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

Remaining = Callable[[DecodeReqView], int]


def usage(members: tuple[DecodeReqView, ...], remaining: Remaining, k: int, block_size: int, pad: int = 0) -> int:
    """Blocks the members still running ``k`` steps from now hold then."""
    return sum(blocks_for(r.context + k + pad, block_size) for r in members if remaining(r) >= k)


def peak_fits(
    members: tuple[DecodeReqView, ...],
    remaining: Remaining,
    capacity: int,
    block_size: int,
    horizons: Iterable[int] | None = None,
    pad: int = 0,
) -> bool:
    """Whether the members' KV stays within ``capacity`` at every horizon (by default: every predicted finish)."""
    ks = set(horizons) if horizons is not None else {remaining(r) for r in members} | {0}
    return all(usage(members, remaining, k, block_size, pad) <= capacity for k in ks)


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
