"""A front door's view of a detached control plane (``frontdoor/remote_cluster.py``): handles of the same actor stay the
same objects across refreshes (streams reopen only for a re-created worker), and the control plane's own
exceptions reach the caller, not Ray's wrapper."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tetriserve.common.config import ClusterConfig
from tetriserve.control_plane.control_plane import ClusterInfo, ClusterView, ControlPlane, FrontDoorRoll
from tetriserve.frontdoor.remote_cluster import RemoteCluster


class Handle:
    """Compares by actor id, as Ray's actor handles do."""

    def __init__(self, actor_id: str) -> None:
        self.actor_id = actor_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and other.actor_id == self.actor_id

    def __hash__(self) -> int:
        return hash(self.actor_id)


def _view(**ids: str) -> ClusterView:
    return ClusterView(
        {w: Handle(a) for w, a in ids.items() if w.startswith("prefill")},
        {w: Handle(a) for w, a in ids.items() if w.startswith("decode")},
        Handle("gs"),
        Handle("mon"),
    )


def _cluster(view: ClusterView, handle: Any = None) -> RemoteCluster:
    info = ClusterInfo(ClusterConfig(), "/models/m", "m", "http://127.0.0.1:8265")
    return RemoteCluster(handle, info, view, refresh=False)


def test_a_refresh_keeps_the_handle_objects_of_the_same_actors_and_takes_new_ones() -> None:
    remote = _cluster(_view(**{"prefill-0": "p0", "decode-0": "d0"}))
    before = dict(remote.decode), dict(remote.prefill), remote.scheduler
    remote._apply(_view(**{"prefill-0": "p0", "decode-0": "d0-life1", "decode-1": "d1"}))
    assert remote.prefill["prefill-0"] is before[1]["prefill-0"]  # the same actor: the same object
    assert remote.scheduler is before[2]
    assert remote.decode["decode-0"] is not before[0]["decode-0"]  # re-created: the new handle
    assert remote.decode["decode-0"].actor_id == "d0-life1" and "decode-1" in remote.decode
    remote._apply(_view(**{"prefill-0": "p0"}))
    assert remote.decode == {}  # removed workers leave the view


def test_a_flipped_worker_keeps_its_handle_object_under_its_new_role() -> None:
    """A flip lists the same actor under the other role: its streams must not reopen (the worker's side of the
    open one would still run)."""
    remote = _cluster(_view(**{"prefill-0": "p0", "decode-0": "d0", "decode-1": "d1"}))
    handle = remote.decode["decode-1"]
    flipped = _view(**{"prefill-0": "p0", "decode-0": "d0"})
    flipped.prefill["decode-1"] = Handle("d1")
    remote._apply(flipped)
    assert remote.prefill["decode-1"] is handle and "decode-1" not in remote.decode
    back = _view(**{"prefill-0": "p0", "decode-0": "d0", "decode-1": "d1"})
    remote._apply(back)
    assert remote.decode["decode-1"] is handle and "decode-1" not in remote.prefill


class _Ref:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def __await__(self) -> Any:
        async def go() -> Any:
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

        return go().__await__()


class _RayTaskError(ValueError):
    """Ray's wrapper: an instance of the cause's class too, carrying the cause."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"ray.exceptions.RayTaskError(...): traceback ... {cause}")
        self.cause = cause


class _Method:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def remote(self, *args: Any) -> _Ref:
        return _Ref(self.outcome)


class _ControlHandle:
    def __init__(self, **outcomes: Any) -> None:
        for name, outcome in outcomes.items():
            setattr(self, name, _Method(outcome))


def test_flip_and_scale_raise_the_control_planes_own_errors() -> None:
    refused = LookupError("unknown worker 'decode-7'")
    remote = _cluster(_view(), _ControlHandle(flip=_RayTaskError(refused), scale=["adding decode-1"]))
    with pytest.raises(LookupError) as err:
        asyncio.run(remote.control().flip("decode-7", "prefill"))
    assert err.value is refused
    assert asyncio.run(remote.control().scale(None, 2)) == ["adding decode-1"]


def test_a_control_plane_still_starting_says_so() -> None:
    plane = ControlPlane.__new__(ControlPlane)  # no launch thread
    plane._cluster, plane._error, plane.roll = None, None, FrontDoorRoll()
    with pytest.raises(ValueError, match="still starting"):
        plane.flip("decode-0", "prefill")
    assert plane.view() is None
    plane.observe_slo_many([(1.0, None, None, None)])  # dropped, not raised


def test_front_doors_attend_through_their_view_calls() -> None:
    roll = FrontDoorRoll(live_s=5.0)
    roll.seen("frontdoor-a", 170.0)
    roll.seen("frontdoor-b", 171.0)
    roll.seen("", 171.0)  # a view call without a front door (a tool) attends nothing
    assert roll.attached(172.0) == ["frontdoor-a", "frontdoor-b"]
    assert roll.attached(172.0, exclude="frontdoor-a") == ["frontdoor-b"]
    roll.leave("frontdoor-b")  # stopped: gone at once, not after live_s
    assert roll.attached(172.0) == ["frontdoor-a"]
    assert roll.attached(176.0) == []  # a silent one (killed) drops out after live_s
