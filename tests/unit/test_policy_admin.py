"""Run-time policy changes: key checks, targets, ordering across workers, and RayBackend over fake actors.

Decode targets are real ``DecodeWorker`` objects without an engine (a stub scheduler
records ``configure``), so their ``set_policy`` is the one the actors run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.actor_fakes import FakeHandle
from tetriserve.common.config import ClusterConfig, DecodeConfig
from tetriserve.common.errors import InvalidRequestError
from tetriserve.decode_worker.moves import SliceMover
from tetriserve.decode_worker.policy import decode_policies
from tetriserve.decode_worker.preemption.stats import PreemptionStats
from tetriserve.decode_worker.preemption.strategy import PreemptionCosts, RecomputeLatency, SwapLatency
from tetriserve.decode_worker.slices import SliceMoves
from tetriserve.decode_worker.views import DecodeSnapshot
from tetriserve.decode_worker.worker import DecodeWorker
from tetriserve.frontdoor import policy_admin, ray_admin
from tetriserve.frontdoor.policy_admin import (
    DECODE_KEYS,
    PREFILL_KEYS,
    UnknownWorkerError,
    apply_changes,
    parse_changes,
    resolve_targets,
)


def test_prefill_keys_follow_the_worker_spec() -> None:
    assert dict(PREFILL_KEYS) == {
        "queue": str,
        "chunking": str,
        "chunk_size": int,
        "selection": str,
        "sched_batch": int,
        "offload_max_tokens": int,
        "sola_tile_tokens": int,  # SOLA §4.4.3's tile, for chunking: sola
        "sola_window_iters": int,  # SOLA §4.4.2's sliding window
    }


def test_decode_keys_follow_the_decode_config() -> None:
    assert dict(DECODE_KEYS) == {
        "admission.policy": str,
        "admission.length_end": str,
        "admission.horizons": str,
        "admission.reserve_blocks": int,
        "admission.proactive_iters": int,
        "admission.buffer_tokens": int,
        "admission.basic_tokens": int,
        "admission.default_tbt_ms": str,  # a float: pydantic reads it from the string
        "admission.zeta": str,  # scls (SCLS eq. 9); a float the config parses
        "admission.cost_profile": str,  # scls
        "preemption.order": str,
        "preemption.mode": str,
        "preemption.profile": str,
        "max_local_prompts": int,
        "slice_iters": int,
    }
    assert not set(DECODE_KEYS) & set(PREFILL_KEYS)  # a key names its role


def test_parse_converts_ints_and_strips() -> None:
    assert parse_changes("prefill", {"sched_batch": " 128 ", "queue": "sjf"}) == {"sched_batch": 128, "queue": "sjf"}
    with pytest.raises(InvalidRequestError) as info:
        parse_changes("prefill", {"queue": "sjf", "chunk_size": "big"})
    assert info.value.field == "chunk_size" and "must be an integer, got 'big'" in str(info.value)
    decode = parse_changes("decode", {"admission.policy": "cacheopt", "admission.reserve_blocks": "2"})
    assert decode == {"admission.policy": "cacheopt", "admission.reserve_blocks": 2}
    with pytest.raises(InvalidRequestError, match=r"admission\.buffer_tokens: must be an integer"):
        parse_changes("decode", {"admission.buffer_tokens": "lots"})


@pytest.mark.parametrize(
    ("role", "key", "text"),
    [
        ("prefill", "admission.policy", "a decode policy key, not a prefill one: send it to decode workers"),
        ("decode", "queue", "a prefill policy key, not a decode one: send it to prefill workers"),
        ("decode", "admission", "unknown decode policy key; known: admission.policy, admission.length_end"),
        ("prefill", "bogus", "unknown prefill policy key; known: queue, chunking"),
    ],
)
def test_parse_names_a_key_of_the_other_role_or_an_unknown_one(role: Any, key: str, text: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_changes(role, {key: "x"})
    assert info.value.field == key and text in str(info.value)


def test_resolve_targets() -> None:
    prefill, decode = {"prefill-0": 0, "prefill-1": 1}, {"decode-0": 2, "decode-1": 3}
    assert resolve_targets(None, prefill, decode) == ("prefill", prefill)
    assert resolve_targets("", prefill, decode) == ("prefill", prefill)
    assert resolve_targets("prefill", prefill, decode) == ("prefill", prefill)
    assert resolve_targets("prefill-1", prefill, decode) == ("prefill", {"prefill-1": 1})
    assert resolve_targets("decode-1", prefill, decode) == ("decode", {"decode-1": 3})
    assert resolve_targets("decode", prefill, decode) == ("decode", decode)
    with pytest.raises(
        UnknownWorkerError, match=r"decode-0, decode-1, prefill-0, prefill-1 \(or 'prefill' or 'decode'"
    ):
        resolve_targets("prefill-2", prefill, decode)
    with pytest.raises(InvalidRequestError, match="no prefill workers"):
        resolve_targets(None, {}, decode)
    with pytest.raises(InvalidRequestError, match="no decode workers") as info:
        resolve_targets("decode", prefill, {})
    assert info.value.field == "worker_id"


def test_colocated_workers_take_both_sides_keys() -> None:
    colocated = {"colocated-0": 0, "colocated-1": 1}
    assert resolve_targets(None, colocated, {}, colocated=True) == ("colocated", colocated)
    assert resolve_targets("colocated-1", colocated, {}, colocated=True) == ("colocated", {"colocated-1": 1})
    changes = parse_changes("colocated", {"queue": "sjf", "chunk_size": "128", "admission.policy": "sola"})
    assert changes == {"queue": "sjf", "chunk_size": 128, "admission.policy": "sola"}
    with pytest.raises(InvalidRequestError, match="unknown colocated policy key"):
        parse_changes("colocated", {"no_such_key": "1"})


@dataclass
class _Worker:
    """Stands in for a PrefillWorker actor: ``policies`` / ``set_policy`` with the worker's error style."""

    policy: dict[str, str] = field(default_factory=lambda: {"queue": "fcfs", "sched_batch": "16"})
    max_batch: int = 1000
    hang: bool = False
    dead: bool = False  # its calls fail as Ray's do once the actor is gone
    received: list[dict[str, Any]] = field(default_factory=list)

    async def policies(self) -> dict[str, str]:
        if self.dead:
            from ray.exceptions import ActorDiedError

            raise ActorDiedError()
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
    return {wid: policy_admin.actor_setter(FakeHandle(w)) for wid, w in workers.items()}


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
    config: ClusterConfig = field(default_factory=ClusterConfig)


def _backend(prefill: dict[str, Any], decode: dict[str, Any]) -> ray_admin.RayAdmin:
    ids = [(w, "decode") for w in decode] + [(w, "prefill") for w in prefill]
    cluster = _Cluster(
        {w: FakeHandle(o) for w, o in prefill.items()},
        {w: FakeHandle(o) for w, o in decode.items()},
        FakeHandle(_Monitor(ids)),
        FakeHandle(_Scheduler()),
    )
    return ray_admin.RayAdmin(cluster, "m")


def test_ray_admin_status_does_not_wait_for_a_stuck_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_admin, "POLICIES_TIMEOUT_S", 0.2)
    decode = _Worker(policy={"admission": "greedy"}, hang=True)
    backend = _backend({"prefill-0": _Worker()}, {"decode-0": decode})
    status = asyncio.run(asyncio.wait_for(backend.status(), 5))
    by_id = {w.worker_id: w for w in status.workers}
    assert by_id["prefill-0"].policy == {"queue": "fcfs", "sched_batch": "16"}
    assert by_id["decode-0"].policy == {} and by_id["decode-0"].state == "serving"


def test_ray_admin_status_of_a_dead_worker_shows_no_policy_and_leaves_the_log_to_the_supervisor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _backend({"prefill-0": _Worker(dead=True)}, {"decode-0": _Worker(policy={"admission": "greedy"})})
    with caplog.at_level("WARNING", logger=ray_admin.__name__):
        status = asyncio.run(asyncio.wait_for(backend.status(), 5))
    assert {w.worker_id: w.policy for w in status.workers} == {"prefill-0": {}, "decode-0": {"admission": "greedy"}}
    assert not caplog.records  # asked every 10 s while it restarts: its death is logged once, by the supervisor


def test_ray_admin_set_policy_converts_and_unwraps_errors() -> None:
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
    with pytest.raises(InvalidRequestError, match="queue: a prefill policy key, not a decode one"):
        asyncio.run(backend.set_policy("decode-0", {"queue": "sjf"}))
    assert prefill["prefill-0"].received == [{"queue": "sjf", "sched_batch": 32}, {"sched_batch": 100}]


# ---- decode workers: the real DecodeWorker.set_policy behind RayBackend -------------------------


class _DecodeScheduler:
    """What ``DecodeWorker.set_policy`` / ``policies`` use of ``TetriDecodeScheduler``; counts ``configure``."""

    def __init__(self) -> None:
        self.admission, self.victim_order, self.strategy = decode_policies(DecodeConfig())
        self.configured = 0
        self.stats = PreemptionStats()

    def configure(self, admission: Any, order: Any, strategy: Any) -> None:
        self.admission, self.victim_order, self.strategy = admission, order, strategy
        self.configured += 1


class _Engine:
    """What the worker uses of ``EngineLoop``: ``call`` into the scheduler, the published snapshot."""

    def __init__(self) -> None:
        self.sched = _DecodeScheduler()

    async def call(self, fn: Any) -> Any:
        return fn(self.sched)

    @property
    def snapshot(self) -> Any:
        return SimpleNamespace(extra=DecodeSnapshot(0, 0.0, (), self.sched.stats.summary()))


def _decode_worker(worker_id: str) -> DecodeWorker:
    """A ``DecodeWorker`` without ``__init__`` (no engine, no transport): just what ``set_policy`` needs."""
    worker = DecodeWorker.__new__(DecodeWorker)
    worker.worker_id = worker_id
    worker.engine = _Engine()
    worker._decode_cfg = DecodeConfig()
    worker.mover = SliceMover(worker)
    return worker


def _configured(workers: dict[str, DecodeWorker]) -> list[int]:
    return [w.engine.sched.configured for w in workers.values()]


def test_set_policy_on_every_decode_worker() -> None:
    decode = {f"decode-{i}": _decode_worker(f"decode-{i}") for i in range(2)}
    backend = _backend({"prefill-0": _Worker()}, decode)
    changes = {"admission.policy": "cacheopt", "preemption.order": "srtf", "admission.reserve_blocks": "2"}
    result = asyncio.run(backend.set_policy("decode", changes))
    assert [(w.worker_id, w.role) for w in result] == [("decode-0", "decode"), ("decode-1", "decode")]
    for w in result:
        assert w.policy == {
            "admission.policy": "cacheopt",
            "admission.reserve_blocks": "2",
            "admission.proactive_iters": "2",  # CacheOpt §5: m = 2 iterations
            "admission.buffer_tokens": "8",
            "admission.basic_tokens": "8",  # CacheOpt §5: B = 8 tokens
            "preemption.order": "srtf",
            "preemption.mode": "recompute",
            "max_local_prompts": "2",
            "slice_iters": "0",
            **PreemptionStats().summary(),
            **SliceMoves().summary(),
        }
    assert all(w.engine.sched.admission.reserve_blocks == 2 for w in decode.values())
    assert decode["decode-1"]._decode_cfg.admission.reserve_blocks == 2
    # one worker by id; the others keep what they had
    (one,) = asyncio.run(backend.set_policy("decode-1", {"preemption.mode": "swap"}))
    assert one.policy["preemption.mode"] == "swap" and one.policy["admission.policy"] == "cacheopt"
    assert decode["decode-0"].policies()["preemption.mode"] == "recompute"
    assert _configured(decode) == [1, 2]


BAD_DECODE: list[tuple[dict[str, str], str, str]] = [
    # changes, field, text in the message
    (
        {"preemption.order": "srtf", "admission.policy": "lifo"},
        "admission.policy",
        "decode-0 rejected the change: decode.admission.policy: Input should be 'greedy',",
    ),
    ({"admission.reserve_blocks": "-1"}, "admission.reserve_blocks", "greater than or equal to 0"),
    ({"preemption.mode": "auto"}, "preemption.mode", "needs a swap/recompute profile (decode.preemption.profile)"),
    ({"preemption.profile": "/no/such/profile.json"}, "preemption.profile", "decode.preemption.profile: preemption"),
]


@pytest.mark.parametrize(("changes", "field", "text"), BAD_DECODE, ids=[c[1] for c in BAD_DECODE])
def test_a_bad_decode_value_changes_no_worker(changes: dict[str, str], field: str, text: str) -> None:
    decode = {f"decode-{i}": _decode_worker(f"decode-{i}") for i in range(2)}
    backend = _backend({"prefill-0": _Worker()}, decode)
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(backend.set_policy("decode", changes))
    assert info.value.field == field and text in str(info.value)
    assert _configured(decode) == [0, 0]
    assert all(w._decode_cfg == DecodeConfig() for w in decode.values())
    assert decode["decode-0"].policies()["admission.policy"] == "greedy"


def test_decode_mode_auto_with_a_profile(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    worker = _decode_worker("decode-0")
    changes = {"preemption.mode": "auto", "preemption.profile": str(profile)}
    with pytest.raises(ValueError, match=r"^decode\.preemption.profile: preemption cost profile"):
        asyncio.run(worker.set_policy(changes))  # not written yet
    PreemptionCosts(RecomputeLatency(1e-6, 1.0, 0.0, 0.0), SwapLatency(1e-7, 0.0), sweet_spot=256).save(profile)
    assert asyncio.run(worker.set_policy(changes))["preemption.mode"] == "auto"
    assert worker.engine.sched.strategy.threshold == 256


def test_the_monitors_decode_keys_are_refused_at_run_time_saying_where_they_are_set() -> None:
    with pytest.raises(InvalidRequestError, match="set at start only") as info:
        parse_changes("decode", {"slice_lambda": "0.3"})
    assert info.value.field == "slice_lambda"
