"""Run-time policy changes (the ``SetPolicy`` admin RPC): which workers, which keys, which types.

    SetPolicy(worker_id, changes: {key: "value"})
        │ resolve_targets       "" / None ─▶ every prefill worker
        │                       unknown id ─▶ UnknownWorkerError                 (gRPC NOT_FOUND)
        │                       decode id  ─▶ InvalidRequestError("worker_id")   (no run-time policies yet)
        │ parse_prefill_changes key must be a ``PrefillPolicySpec`` field; int fields parsed here,
        │                       so a worker never sees "128" for sched_batch ─▶ InvalidRequestError(key)
        ▼
    apply_changes  the first target first: a value the workers reject then changes nothing anywhere;
                   the others in parallel. A worker's ValueError ─▶ InvalidRequestError naming the key
                   its message mentions (gRPC INVALID_ARGUMENT, trailing metadata tetriserve-field=key).

Both backends share this module: the Ray backend passes a setter that calls the
actor, the test fake one that edits a dict. Decode workers get their own key
table here once they have run-time policies (a later issue).
"""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from common.errors import InvalidRequestError
from control_plane.backend import WorkerPolicy
from prefill_worker.policy import PrefillPolicySpec

logger = logging.getLogger(__name__)

_H = TypeVar("_H")

# key -> type of value the prefill worker's ``set_policy`` expects, from the spec it builds policies from
_HINTS = typing.get_type_hints(PrefillPolicySpec)
PREFILL_KEYS: dict[str, type] = {f.name: int if _HINTS[f.name] is int else str for f in fields(PrefillPolicySpec)}
NO_DECODE_POLICIES = "decode workers have no run-time policies yet"

Setter = Callable[[dict[str, Any]], Awaitable[Mapping[str, str]]]


class UnknownWorkerError(LookupError):
    """No worker has this id (gRPC NOT_FOUND)."""

    def __init__(self, worker_id: str, known: list[str]) -> None:
        super().__init__(f"worker_id: no worker {worker_id!r}; known: {', '.join(known) or 'none'}")
        self.worker_id = worker_id


def resolve_targets(worker_id: str | None, prefill: Mapping[str, _H], decode: Mapping[str, _H]) -> dict[str, _H]:
    """The workers a change goes to: one by id, or every prefill worker for ``None`` / ``""``."""
    if not worker_id:
        if not prefill:
            raise InvalidRequestError("worker_id", "the cluster has no prefill workers")
        return dict(prefill)
    if worker_id in prefill:
        return {worker_id: prefill[worker_id]}
    if worker_id in decode:
        raise InvalidRequestError("worker_id", f"{NO_DECODE_POLICIES} ({worker_id} is a decode worker)")
    raise UnknownWorkerError(worker_id, sorted([*prefill, *decode]))


def parse_prefill_changes(changes: Mapping[str, str]) -> dict[str, Any]:
    """Check the keys against the prefill policy spec and convert integer values."""
    if not changes:
        raise InvalidRequestError("changes", f"give at least one KEY=VALUE; keys: {', '.join(PREFILL_KEYS)}")
    parsed: dict[str, Any] = {}
    for key, raw in changes.items():
        kind = PREFILL_KEYS.get(key)
        if kind is None:
            raise InvalidRequestError(key, f"unknown prefill policy key; known: {', '.join(PREFILL_KEYS)}")
        value = str(raw).strip()
        if not value:
            raise InvalidRequestError(key, "value must not be empty")
        if kind is int:
            try:
                parsed[key] = int(value)
            except ValueError:
                raise InvalidRequestError(key, f"must be an integer, got {value!r}") from None
        else:
            parsed[key] = value
    return parsed


def rejection(worker_id: str, changes: Mapping[str, Any], exc: BaseException, done: list[str]) -> InvalidRequestError:
    """A worker's ValueError as an ``InvalidRequestError`` whose field is the key its message names."""
    message = str(exc)
    field = next((key for key in changes if key in message), "changes")
    already = f" (already changed: {', '.join(done)})" if done else ""
    return InvalidRequestError(field, f"{worker_id} rejected the change: {message}{already}")


async def apply_changes(
    targets: Mapping[str, Setter], changes: dict[str, Any], role: str = "prefill"
) -> list[WorkerPolicy]:
    """Call every target's setter with ``changes``; returns the workers' policies as they now are.

    The first target goes alone, so a value every (identical) worker would
    reject changes nothing; the rest then go in parallel.
    """
    ids = list(targets)
    results: dict[str, Mapping[str, str]] = {}
    for batch in (ids[:1], ids[1:]):
        outcomes = await asyncio.gather(*(targets[w](changes) for w in batch), return_exceptions=True)
        failed: tuple[str, BaseException] | None = None
        for wid, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed = failed or (wid, outcome)
            else:
                results[wid] = outcome
        if failed is not None:
            wid, exc = failed
            if isinstance(exc, ValueError):
                raise rejection(wid, changes, exc, sorted(results)) from exc
            raise exc
    logger.info("policy change %s applied to %s", changes, ", ".join(ids))
    return [WorkerPolicy(wid, role, dict(results[wid])) for wid in ids]
