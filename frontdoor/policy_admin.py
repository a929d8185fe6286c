"""Run-time policy changes (the ``SetPolicy`` admin RPC): which workers, which keys, which types.

    SetPolicy(worker_id, changes: {key: "value"})
        │ resolve_targets  "" / None / "prefill" ─▶ every prefill worker
        │                  "decode"              ─▶ every decode worker
        │                  a worker's id         ─▶ that worker (its role picks the key table)
        │                  unknown id            ─▶ UnknownWorkerError                (gRPC NOT_FOUND)
        │ parse_changes    key must be in the role's table: PREFILL_KEYS (``PrefillPolicySpec``) or
        │                  DECODE_KEYS (``DecodeConfig``'s dotted keys, ``admission.policy``); a key of the
        │                  other role ─▶ InvalidRequestError(key)
        │                  saying whose it is; int fields parsed here, so a worker never sees "128"
        ▼
    apply_changes  the first target first: a value the workers reject then changes nothing anywhere;
                   the others in parallel. A worker's ValueError ─▶ InvalidRequestError naming the key
                   its message mentions (gRPC INVALID_ARGUMENT, trailing metadata tetriserve-field=key).

Both backends share this module: the Ray backend passes a setter that calls the
actor, the test fake one that edits a dict. Whether a value is allowed (a policy
name, a bound) is the worker's call, as it builds the policies from it.
"""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import fields
from typing import Literal, Protocol, TypeVar

from tetriserve.common.config import DECODE_MONITOR_KEYS, DecodeConfig
from tetriserve.common.config_keys import RENAMED, leaf_keys
from tetriserve.common.errors import InvalidRequestError
from tetriserve.control_plane.handles import PolicyValue, RemoteMethod
from tetriserve.frontdoor.backend import WorkerPolicy
from tetriserve.prefill_worker.policy import PrefillPolicySpec

logger = logging.getLogger(__name__)

_H = TypeVar("_H")
Role = Literal["prefill", "decode", "colocated"]

# key -> type of value the worker's ``set_policy`` expects, from what it builds its policies from
_HINTS = typing.get_type_hints(PrefillPolicySpec)
PREFILL_KEYS: dict[str, type] = {f.name: int if _HINTS[f.name] is int else str for f in fields(PrefillPolicySpec)}
DECODE_KEYS: dict[str, type] = {
    key.path: int if key.annotation is int else str
    for key in leaf_keys(DecodeConfig)
    if key.path not in DECODE_MONITOR_KEYS
}
# a colocated worker runs both sides: the prefill side's keys and the decode side's
KEYS: dict[Role, dict[str, type]] = {
    "prefill": PREFILL_KEYS,
    "decode": DECODE_KEYS,
    "colocated": {**PREFILL_KEYS, **DECODE_KEYS},
}

Setter = Callable[[dict[str, PolicyValue]], Awaitable[Mapping[str, str]]]
SET_POLICY_TIMEOUT_S = 30.0  # one worker actor's ``set_policy`` call


class UnknownWorkerError(LookupError):
    """No worker has this id (gRPC NOT_FOUND)."""

    def __init__(self, worker_id: str, known: list[str]) -> None:
        roles = " or ".join(repr(r) for r in KEYS)
        super().__init__(
            f"worker_id: no worker {worker_id!r}; known: {', '.join(known) or 'none'} (or {roles} for all of a role)"
        )
        self.worker_id = worker_id


def describe_target(worker_id: str | None) -> str:
    """``worker_id`` in words, for logs and messages."""
    if not worker_id or worker_id in KEYS:
        return f"every {worker_id or 'prefill'} worker"
    return worker_id


def resolve_targets(
    worker_id: str | None, prefill: Mapping[str, _H], decode: Mapping[str, _H], colocated: bool = False
) -> tuple[Role, dict[str, _H]]:
    """The role and workers a change goes to: one by id, or every worker of a role (``None`` / ``""``: prefill,
    or in the colocated mode, where ``prefill`` holds the colocated workers, colocated)."""
    placed: Role = "colocated" if colocated else "prefill"
    by_role: dict[Role, Mapping[str, _H]] = {placed: prefill, "decode": decode}
    for role, workers in by_role.items():
        if worker_id and worker_id in workers:
            return role, {worker_id: workers[worker_id]}
    for role, workers in by_role.items():
        if (worker_id or placed) == role:
            if not workers:
                raise InvalidRequestError("worker_id", f"the cluster has no {role} workers")
            return role, dict(workers)
    raise UnknownWorkerError(str(worker_id), sorted([*prefill, *decode]))


def parse_changes(role: Role, changes: Mapping[str, str]) -> dict[str, PolicyValue]:
    """Check the keys against the ``role``'s table and convert integer values."""
    table = KEYS[role]
    if not changes:
        raise InvalidRequestError("changes", f"give at least one KEY=VALUE; {role} keys: {', '.join(table)}")
    parsed: dict[str, PolicyValue] = {}
    for key, raw in changes.items():
        kind = table.get(key)
        if kind is None:
            raise InvalidRequestError(key, _not_a_key(role, key))
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


def _not_a_key(role: Role, key: str) -> str:
    other: Role = "decode" if role in ("prefill", "colocated") else "prefill"
    if key in KEYS[other]:
        return (
            f"a {other} policy key, not a {role} one: send it to {other} workers "
            f"(worker_id {other!r} for all of them, or one {other} worker's id)"
        )
    if role == "decode" and f"decode.{key}" in RENAMED:
        new = RENAMED[f"decode.{key}"].removeprefix("decode.")
        return f"decode.{key} is now decode.{new}: send {new}"
    if role == "decode" and key in DECODE_MONITOR_KEYS:
        return f"decode.{key} is the cluster monitor's, set at start only (serve --config or --set decode.{key}=...)"
    return f"unknown {role} policy key; known: {', '.join(KEYS[role])}"


def rejection(
    worker_id: str, changes: Mapping[str, object], exc: BaseException, done: list[str]
) -> InvalidRequestError:
    """A worker's ValueError as an ``InvalidRequestError`` whose field is the key its message names."""
    message = str(exc)
    field = next((key for key in changes if key in message), "changes")
    already = f" (already changed: {', '.join(done)})" if done else ""
    return InvalidRequestError(field, f"{worker_id} rejected the change: {message}{already}")


async def apply_changes(
    targets: Mapping[str, Setter], changes: dict[str, PolicyValue], role: Role = "prefill"
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


class PolicyHandle(Protocol):
    """A worker actor's ``set_policy`` (``control_plane.handles.WorkerHandle`` has it)."""

    @property
    def set_policy(self) -> RemoteMethod[[dict[str, PolicyValue]], Mapping[str, str]]: ...


def actor_setter(handle: PolicyHandle) -> Setter:
    """``handle.set_policy.remote`` as a coroutine that raises the worker's own ValueError, not Ray's wrapper."""

    async def call(changes: dict[str, PolicyValue]) -> dict[str, str]:
        try:
            return dict(await asyncio.wait_for(handle.set_policy.remote(changes), SET_POLICY_TIMEOUT_S))
        except ValueError as exc:  # Ray raises a RayTaskError that is also a ValueError; .cause is the worker's
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, ValueError) else exc) from None

    return call
