"""AccelGen's decode admission (AccelGen §4.3): waiting TG tasks in ascending TBT slack T_r = SLO_TBT − T_w −
T_max, the reading-speed default where a request has no TBT SLO, vLLM's fit test, built from config; the
preemption order of Alg. 1 line 3 (the largest remaining time first)."""

from __future__ import annotations

import pytest

from tetriserve.common.config import ClusterConfig, DecodeConfig
from tetriserve.decode_worker.admission import make_admission_policy
from tetriserve.decode_worker.admission.accelgen import AccelGenDecode
from tetriserve.decode_worker.policy import decode_policies
from tetriserve.decode_worker.preemption import make_preemption_order
from tetriserve.decode_worker.preemption.order import AccelGenOrder
from tetriserve.decode_worker.views import DecodeReqView, DecodeState

BS = 16


def test_the_tightest_tbt_slack_goes_first_and_a_reorder_is_counted() -> None:
    # now 1.0, step 0.02 s (T_max). a: TBT 0.5, waited 0.1 → 0.5 − 0.1 − 0.02 = 0.38
    # b: TBT 0.1, waited 0.05 → 0.1 − 0.05 − 0.02 = 0.03
    # c: no TBT SLO → 0.1875 (reading speed), waited 0.2 → 0.1875 − 0.2 − 0.02 = −0.0325
    state = DecodeState(free_blocks=100, block_size=BS, now=1.0, step_s=0.02)
    a = DecodeReqView("a", 16, 100, arrival_time=0.9, tbt_slo_s=0.5)
    b = DecodeReqView("b", 16, 100, arrival_time=0.95, tbt_slo_s=0.1)
    c = DecodeReqView("c", 16, 100, arrival_time=0.8)
    policy = AccelGenDecode()
    assert [policy.remaining_time(r, state) for r in (a, b, c)] == pytest.approx([0.38, 0.03, -0.0325])
    assert [r.request_id for r in policy.order([a, b, c], state)] == ["c", "b", "a"]  # arrival: c, a, b
    assert policy.decisions.snapshot() == {"reordered": 1}
    assert [r.request_id for r in policy.order([c, a], state)] == ["c", "a"]  # arrival order: nothing to count
    assert policy.decisions.snapshot() == {"reordered": 1}


def test_the_default_tbt_applies_only_without_one_and_admission_is_vllms_fit_test() -> None:
    # default 0.3 s: c (no SLO, waited 0.2) → 0.3 − 0.2 − 0.02 = 0.08 > b's 0.03, so b first
    state = DecodeState(free_blocks=2, block_size=BS, now=1.0, step_s=0.02)
    b = DecodeReqView("b", 16, 100, arrival_time=0.95, tbt_slo_s=0.1)
    c = DecodeReqView("c", 16, 100, arrival_time=0.8)
    policy = AccelGenDecode(default_tbt_ms=300)
    assert [r.request_id for r in policy.order([c, b], state)] == ["b", "c"]
    assert policy.admit(DecodeReqView("fits", 32, 500), state)  # 2 blocks now; its future is not looked at
    assert not policy.admit(DecodeReqView("too-big", 33, 1), state)  # 3 blocks > 2 free
    with pytest.raises(ValueError, match="default_tbt_ms"):
        AccelGenDecode(default_tbt_ms=0)


def test_decode_admission_accelgen_from_config() -> None:
    cfg = ClusterConfig(decode={"admission": {"policy": "accelgen", "default_tbt_ms": 250}})
    admission, _, _ = decode_policies(cfg.decode)
    assert isinstance(admission, AccelGenDecode) and admission.default_tbt_s == 0.25
    default = make_admission_policy("accelgen")
    assert isinstance(default, AccelGenDecode) and default.default_tbt_s == 0.1875  # AccelGen §4.3: 187.5 ms
    with pytest.raises(ValueError, match="default_tbt_ms: a parameter of accelgen"):
        DecodeConfig.model_validate({"admission": {"policy": "greedy", "default_tbt_ms": 250}})


def test_the_preemption_order_takes_the_largest_remaining_time_first() -> None:
    # a running TG task's T_r = SLO_TBT − T_max: a (0.5 s) > c (no SLO: 0.1875 s) > b (0.1 s), T_max the same for
    # all; vLLM would take the latest arrival, b, first
    a = DecodeReqView("a", 16, 100, arrival_time=1.0, tbt_slo_s=0.5)
    b = DecodeReqView("b", 16, 100, arrival_time=3.0, tbt_slo_s=0.1)
    c = DecodeReqView("c", 16, 100, arrival_time=2.0)
    order = make_preemption_order("accelgen")
    assert isinstance(order, AccelGenOrder)
    assert [v.request_id for v in order.victims([a, b, c])] == ["a", "c", "b"]
    assert order.decisions.snapshot() == {"reordered": 1}
    # equal SLOs: the latest arrival first, as vLLM does; nothing to count
    same = [DecodeReqView("x", 16, 100, arrival_time=1.0), DecodeReqView("y", 16, 100, arrival_time=2.0)]
    assert [v.request_id for v in order.victims(same)] == ["y", "x"]
    assert order.decisions.snapshot() == {"reordered": 1}
    cfg = ClusterConfig(decode={"preemption": {"order": "accelgen"}})
    assert decode_policies(cfg.decode)[1].name == "accelgen"
