"""What the decode scheduler subclass shows CacheOpt's admission (§3.3.2): when a waiting request's latest token
came, and which waiting requests are put to admission at all (no Ray, no engine: a stand-in scheduler)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tetriserve.common.engine_tags import EngineTags
from tetriserve.decode_worker.planner import DecodePlanner


def _req(rid: str, arrival: float, computed: int = 0, kv: dict[str, object] | None = None) -> Any:
    params = SimpleNamespace(extra_args=EngineTags(request_id=rid, tbt_slo_s=0.1).extra(), max_tokens=50)
    return SimpleNamespace(
        request_id=rid, sampling_params=params, output_token_ids=[], num_output_tokens=0, num_prompt_tokens=20,
        arrival_time=arrival, num_computed_tokens=computed, kv_transfer_params=kv,
    )  # fmt: skip


def test_a_waiting_requests_latest_token_is_its_preemption_or_its_arrival_here() -> None:
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler

    planner = DecodePlanner()
    planner.preempted("out", computed=30, now=7.5, can_swap=False)
    scheduler = SimpleNamespace(planner=planner, block_size=16)
    fresh, out = _req("fresh", arrival=5.0), _req("out", arrival=2.0)
    assert TetriDecodeScheduler._view(scheduler, fresh, waiting=True).waited_since == 5.0  # type: ignore[arg-type]
    assert TetriDecodeScheduler._view(scheduler, out, waiting=True).waited_since == 7.5  # type: ignore[arg-type]
    # at 8.0 its TBT slack is 0.1 − (8.0 − 7.5) = −0.4
    view = TetriDecodeScheduler._view(scheduler, out, waiting=True)  # type: ignore[arg-type]
    assert view.tbt_slack(8.0) == -0.4
    assert TetriDecodeScheduler._view(scheduler, out).waited_since is None  # type: ignore[arg-type]


def test_only_a_request_whose_kv_is_still_to_land_passes_admission_unasked() -> None:
    from tetriserve.decode_worker.vllm_scheduler import TetriDecodeScheduler

    scheduler = SimpleNamespace(_recomputing={"again"})
    recv = {"tetriserve_kv": "recv"}
    assert TetriDecodeScheduler._must_pass(scheduler, _req("landing", 1.0, kv=recv))  # type: ignore[arg-type]
    # preempted by recomputation: its instruction is spent, it waits to be asked like any other
    assert not TetriDecodeScheduler._must_pass(scheduler, _req("again", 1.0, kv=recv))  # type: ignore[arg-type]
    assert not TetriDecodeScheduler._must_pass(scheduler, _req("landed", 1.0, computed=20, kv=recv))  # type: ignore[arg-type]
    assert not TetriDecodeScheduler._must_pass(scheduler, _req("local", 1.0))  # type: ignore[arg-type]


def test_admission_cost_counts_the_steps_admission_ran_and_their_mean() -> None:
    from tetriserve.decode_worker.vllm_scheduler import AdmissionCost

    cost = AdmissionCost()
    assert cost.summary() == {"admission_steps": "0", "admission_mean_us": "-"}
    cost.add(0.000_100)
    cost.add(0.000_300)
    assert cost.summary() == {"admission_steps": "2", "admission_mean_us": "200"}
