"""A request's KV in parts, one per prefill chunk: how the parts of a key are named.

The prefill engine parks each chunk's KV as chunked prefill computes it, under ``part_key(key, i, last)``:
parts 0, 1, … cover whole blocks in the order of the request's block table, and the last part (marked)
the rest. A landing area (``store.ReceiveStore``) answers for ``key`` itself once the last part and every
part before it are there: ``landed(key)`` is then true and ``recv(key)`` returns the parts' buffers one
after another (``kv_codec.unpack_into`` reads them in order), so a receiver never sees parts. Discarding
``key`` drops its parts, and those that land later; a part that fails marks ``key`` failed.
"""

from __future__ import annotations

from collections.abc import Iterable

SEP = "#part"
LAST = ".last"


def part_key(key: str, index: int, last: bool) -> str:
    return f"{key}{SEP}{index}{LAST if last else ''}"


def split(key: str) -> tuple[str, int, bool] | None:
    """(key, index, last) of a part's key; None for a key that is not a part's."""
    base, sep, tail = key.rpartition(SEP)
    if not sep:
        return None
    last = tail.endswith(LAST)
    digits = tail[: -len(LAST)] if last else tail
    return (base, int(digits), last) if digits.isdigit() else None


def is_last(key: str) -> bool:
    """Whether ``key`` is a last part's, or a key parked whole."""
    parsed = split(key)
    return parsed is None or parsed[2]


def base_of(key: str) -> str:
    parsed = split(key)
    return key if parsed is None else parsed[0]


def complete(key: str, present: Iterable[str]) -> list[str] | None:
    """The keys of ``key``'s parts in order, if ``present`` holds its last part and every part before it."""
    found: dict[int, str] = {}
    last = None
    for k in present:
        parsed = split(k)
        if parsed is None or parsed[0] != key:
            continue
        found[parsed[1]] = k
        if parsed[2]:
            last = parsed[1]
    if last is None or any(i not in found for i in range(last + 1)):
        return None
    return [found[i] for i in range(last + 1)]


def next_part(
    key: str, num_tokens: int, saved_blocks: int, index: int, computed: int, block_size: int
) -> tuple[str, int, int, int] | None:
    """The part a producer of ``num_tokens`` tokens' KV parks once ``computed`` tokens' KV is: (its key, first
    block, end block, tokens), the blocks filled since its ``saved_blocks`` in earlier parts, or everything left
    when all are computed (the last part); None when no block has filled since."""
    last = computed >= num_tokens
    end = -(-num_tokens // block_size) if last else computed // block_size
    if not last and end <= saved_blocks:
        return None
    tokens = (num_tokens if last else end * block_size) - saved_blocks * block_size
    return part_key(key, index, last), saved_blocks, end, tokens
