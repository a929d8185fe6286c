"""Run-time policy changes: key checks, targets, ordering across workers, and RayBackend over fake actors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from common.errors import InvalidRequestError
from control_plane import ray_backend
from control_plane.policy_admin import (
    PREFILL_KEYS,
    UnknownWorkerError,
    apply_changes,
    parse_prefill_changes,
    resolve_targets,
)
from tests.actor_fakes import FakeHandle


def test_prefill_keys_follow_the_worker_spec() -> None:
    assert dict(PREFILL_KEYS) == {
        "queue": str,
        "chunking": str,
        "chunk_size": int,
        "selection": str,
        "sched_batch": int,
    }


def test_parse_converts_ints_and_strips() -> None:
    assert parse_prefill_changes({"sched_batch": " 128 ", "queue": "sjf"}) == {"sched_batch": 128, "queue": "sjf"}
    with pytest.raises(InvalidRequestError) as info:
        parse_prefill_changes({"queue": "sjf", "chunk_size": "big"})
    assert info.value.field == "chunk_size" and "must be an integer, got 'big'" in str(info.value)


def test_resolve_targets() -> None:
    prefill, decode = {"prefill-0": 0, "prefill-1": 1}, {"decode-0": 2}
    assert resolve_targets(None, prefill, decode) == prefill
    assert resolve_targets("", prefill, decode) == prefill
    assert resolve_targets("prefill-1", prefill, decode) == {"prefill-1": 1}
    with pytest.raises(InvalidRequestError, match="decode workers have no run-time policies yet") as info:
        resolve_targets("decode-0", prefill, decode)
    assert info.value.field == "worker_id"
    with pytest.raises(UnknownWorkerError, match="decode-0, prefill-0, prefill-1"):
        resolve_targets("prefill-2", prefill, decode)
    with pytest.raises(InvalidRequestError, match="no prefill workers"):
        resolve_targets(None, {}, decode)


@dataclass
class _Worker:
    """Stands in for a PrefillWorker actor: ``policies`` / ``set_policy`` with the worker's error style."""

    policy: dict[str, str] = field(default_factory=lambda: {"queue": "fcfs", "sched_batch": "16"})
    max_batch: int = 1000
    hang: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)

    async def policies(self) -> dict[str, str]:
        if self.hang:
            await asyncio.sleep(3600)
        return dict(self.policy)

    def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
        self.received.append(dict(changes))
        if changes.get("sched_batch", 1) > self.max_batch:
            raise ValueError(f"prefill.sched_batch {changes['sched_batch']} exceeds {self.max_batch}")
        self.policy.update({k: str(v) for k, v in changes.items()})
        return dict(self.policy)


def _setters(workers: dict[str, _Worker]) -> dict[str, Any]:
    return {wid: ray_backend._actor_setter(FakeHandle(w)) for wid, w in workers.items()}


def test_first_worker_goes_alone_so_a_rejected_value_changes_nothing() -> None:
    workers = {f"prefill-{i}": _Worker(max_batch=64) for i in range(3)}
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(apply_changes(_setters(workers), {"queue": "sjf", "sched_batch": 128}))
    assert info.value.field == "sched_batch"
    assert "prefill-0 rejected the change: prefill.sched_batch 128 exceeds 64" in str(info.value)
    assert "already changed" not in str(info.value)
    assert [len(w.received) for w in workers.values()] == [1, 0, 0]


def test_partial_failure_names_the_workers_already_changed() -> None:
    workers = {"prefill-0": _Worker(), "prefill-1": _Worker(), "prefill-2": _Worker(max_batch=64)}
    with pytest.raises(InvalidRequestError, match=r"prefill-2 rejected .*already changed: prefill-0, prefill-1"):
        asyncio.run(apply_changes(_setters(workers), {"sched_batch": 128}))


def test_apply_to_every_worker_returns_their_policies() -> None:
    workers = {f"prefill-{i}": _Worker() for i in range(3)}
    result = asyncio.run(apply_changes(_setters(workers), {"queue": "sjf"}))
    assert [(w.worker_id, w.role, w.policy["queue"]) for w in result] == [
        (f"prefill-{i}", "prefill", "sjf") for i in range(3)
    ]


class _Monitor:
    def __init__(self, ids: list[tuple[str, str]]) -> None:
        self.ids = ids

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"worker_id": w, "role": r, "state": "serving", "load": {"x": 1.0}} for w, r in self.ids]


class _Scheduler:
    def status(self) -> dict[str, Any]:
        return {"in_flight": 0}


@dataclass
class _Cluster:
    prefill: dict[str, Any]
    decode: dict[str, Any]
    monitor: Any
    scheduler: Any
    dashboard_url: str = ""


def _backend(prefill: dict[str, _Worker], decode: dict[str, _Worker]) -> ray_backend.RayBackend:
    ids = [(w, "decode") for w in decode] + [(w, "prefill") for w in prefill]
    cluster = _Cluster(
        {w: FakeHandle(o) for w, o in prefill.items()},
        {w: FakeHandle(o) for w, o in decode.items()},
        FakeHandle(_Monitor(ids)),
        FakeHandle(_Scheduler()),
    )
    return ray_backend.RayBackend(cluster, "m")  # type: ignore[arg-type]


def test_ray_backend_status_does_not_wait_for_a_stuck_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "POLICIES_TIMEOUT_S", 0.2)
    decode = _Worker(policy={"admission": "greedy"}, hang=True)
    backend = _backend({"prefill-0": _Worker()}, {"decode-0": decode})
    status = asyncio.run(asyncio.wait_for(backend.status(), 5))
    by_id = {w.worker_id: w for w in status.workers}
    assert by_id["prefill-0"].policy == {"queue": "fcfs", "sched_batch": "16"}
    assert by_id["decode-0"].policy == {} and by_id["decode-0"].state == "serving"


def test_ray_backend_set_policy_converts_and_unwraps_errors() -> None:
    prefill = {"prefill-0": _Worker(max_batch=64)}
    backend = _backend(prefill, {"decode-0": _Worker(policy={"admission": "greedy"})})
    result = asyncio.run(backend.set_policy(None, {"queue": "sjf", "sched_batch": "32"}))
    assert result[0].policy == {"queue": "sjf", "sched_batch": "32"}
    assert prefill["prefill-0"].received == [{"queue": "sjf", "sched_batch": 32}]
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(backend.set_policy("prefill-0", {"sched_batch": "100"}))
    assert info.value.field == "sched_batch" and "exceeds 64" in str(info.value)
    with pytest.raises(UnknownWorkerError):
        asyncio.run(backend.set_policy("prefill-3", {"queue": "sjf"}))
    with pytest.raises(InvalidRequestError, match="decode workers"):
        asyncio.run(backend.set_policy("decode-0", {"queue": "sjf"}))


class _RayStyleError(ValueError):
    """Like Ray's RayTaskError(ValueError): the worker's exception is in ``cause``."""

    def __init__(self, cause: ValueError) -> None:
        super().__init__(f"ray.exceptions.RayTaskError(ValueError): traceback...\n{cause}")
        self.cause = cause


def test_actor_setter_raises_the_workers_own_error() -> None:
    class Raising:
        def set_policy(self, changes: dict[str, Any]) -> dict[str, str]:
            raise _RayStyleError(ValueError("prefill.chunking: unknown policy 'x'"))

    setter = ray_backend._actor_setter(FakeHandle(Raising()))

    async def call() -> object:
        return await setter({"chunking": "x"})

    with pytest.raises(ValueError) as info:
        asyncio.run(call())
    assert str(info.value) == "prefill.chunking: unknown policy 'x'"
