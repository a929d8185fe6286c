"""SetPolicy on the real cluster: change the prefill and decode workers' policies over gRPC, read them back,
restore them."""

from __future__ import annotations

from typing import Any

import pytest

from tetriserve.client import InvalidArgument, TetriServeClient


def test_set_policy_on_the_real_prefill_worker_shows_in_status(frontend: Any) -> None:
    with TetriServeClient(frontend.grpc_target, timeout=60) as client:
        before = {w.worker_id: w for w in client.cluster_status().workers}
        (prefill_id,) = [wid for wid, w in before.items() if w.role == "prefill"]
        original = {k: before[prefill_id].policy[k] for k in ("queue", "sched_batch")}
        assert all(w.policy for w in before.values()), "every worker reports its policies"
        shown = before[prefill_id].policy  # and its length predictor: the trained one, loading or loaded
        assert shown["predictor"].startswith("trained") and shown["predictor_state"] in ("loading", "ready"), shown
        try:
            update = client.set_policy({"queue": "sjf", "sched_batch": 8})
            assert update.policy_of(prefill_id)["queue"] == "sjf"
            after = {w.worker_id: w for w in client.cluster_status().workers}
            assert (after[prefill_id].policy["queue"], after[prefill_id].policy["sched_batch"]) == ("sjf", "8")
            with pytest.raises(InvalidArgument) as info:  # the worker's own check, mapped to the key
                client.set_policy({"sched_batch": 0}, worker_id=prefill_id)
            assert info.value.field == "sched_batch"
        finally:
            client.set_policy(original)
        restored = {w.worker_id: w for w in client.cluster_status().workers}[prefill_id].policy
        assert {k: restored[k] for k in original} == original


def test_set_policy_on_the_real_decode_worker_shows_in_status(frontend: Any) -> None:
    with TetriServeClient(frontend.grpc_target, timeout=60) as client:
        before = {w.worker_id: w for w in client.cluster_status().workers}
        (decode_id,) = [wid for wid, w in before.items() if w.role == "decode"]
        shown = before[decode_id].policy
        original = {"admission.policy": shown["admission.policy"], "preemption.order": shown["preemption.order"]}
        try:
            update = client.set_policy({"admission.policy": "cacheopt", "preemption.order": "srtf"}, worker_id="decode")
            policy = update.policy_of(decode_id)
            assert (policy["admission.policy"], policy["preemption.order"]) == ("cacheopt", "srtf")
            after = {w.worker_id: w for w in client.cluster_status().workers}[decode_id].policy
            assert (after["admission.policy"], after["preemption.order"]) == ("cacheopt", "srtf")
            with pytest.raises(InvalidArgument) as info:  # the worker's own check, mapped to the key
                client.set_policy({"admission.policy": "lifo"}, worker_id=decode_id)
            assert info.value.field == "admission.policy"
            with pytest.raises(InvalidArgument) as info:  # a prefill key never reaches a decode worker
                client.set_policy({"queue": "sjf"}, worker_id="decode")
            assert info.value.field == "queue"
        finally:
            client.set_policy(original, worker_id="decode")
        restored = {w.worker_id: w for w in client.cluster_status().workers}[decode_id].policy
        assert (restored["admission.policy"], restored["preemption.order"]) == tuple(original.values())
