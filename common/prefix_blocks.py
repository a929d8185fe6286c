"""A prompt's prefix as placement sees it: one hash per full KV block, each covering every token before it.

An engine's prefix cache reuses a block only when the whole prompt up to that block's end matches (vLLM keys a
block by its tokens and its parent block's key), so the hash of block ``i`` is chained over blocks ``0..i``:

    h₀ = H(tokens[0 : B]),   hᵢ = H(hᵢ₋₁ ‖ tokens[i·B : (i+1)·B])      B: the engine's block size

Two prompts share their first ``k`` hashes exactly when they share their first ``k·B`` tokens (up to a 64-bit
collision). A trailing partial block has no hash: engines cache full blocks only. ``H`` is BLAKE2b with an
8-byte digest, so every process (each front door, the GlobalScheduler) computes the same hashes whatever its
``PYTHONHASHSEED``. Pure: no engine, no Ray.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def block_hashes(tokens: Sequence[int], block_size: int, limit: int | None = None) -> tuple[int, ...]:
    """The chained hashes of the full blocks of ``tokens`` (at most ``limit`` of them)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n = len(tokens) // block_size
    if limit is not None:
        n = min(n, limit)
    out: list[int] = []
    parent = b""
    for i in range(n):
        block = array("q", tokens[i * block_size : (i + 1) * block_size]).tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        out.append(int.from_bytes(parent, "little", signed=True))
    return tuple(out)
