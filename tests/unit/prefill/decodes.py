"""Decode workers as a prefill worker's tests see them: broadcast loads and a decode directory over them."""

from __future__ import annotations

import random

from tetriserve.common.load import DecodeLoad
from tetriserve.prefill_worker.directory import DecodeDirectory
from tetriserve.prefill_worker.dispatch import DispatchParams, make_dispatch_policy


def decode_load(worker_id: str, room: int, running: int = 0) -> DecodeLoad:
    """A decode worker's load with ``room`` for prompts it would compute itself."""
    return DecodeLoad(worker_id, 100, 100, 32, running, 0, 0, 0, 0.0, prompt_room=room)


class _Handle:
    """A decode worker's actor handle: never called (no take is made through it)."""


def directory(loads: list[DecodeLoad] | None = None) -> DecodeDirectory:
    """A directory of decode-0..2 (addresses and peers known), with ``loads`` as the last broadcast."""
    dispatcher = make_dispatch_policy("round-robin", DispatchParams(512))
    found = DecodeDirectory("prefill-0", dispatcher, random.Random(0), 512, lambda decode_id, incarnation: None)
    handles = {f"decode-{i}": _Handle() for i in range(3)}
    found.update(loads or [], {d: f"tcp://{d}" for d in handles}, handles)  # type: ignore[arg-type]
    return found
