"""Tests for the common request model: lifecycle, sampling/SLO validation, length estimates, config, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tetriserve.common.config import ClusterConfig
from tetriserve.common.errors import InvalidRequestError, UnknownModelError
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import SLO, Request, RequestEvent, RequestState, SamplingSpec

S = RequestState
HAPPY_PATH = [S.PREFILLING, S.TRANSFERRING, S.DECODE_QUEUED, S.DECODING]
NOT_FINISHED = [s for s in S if not s.finished]
FINISHED = [s for s in S if s.finished]


def make_request(arrival: float = 100.0, rid: str = "r1") -> Request:
    return Request(rid, (1, 2, 3), arrival_time=arrival)


def request_in(state: RequestState) -> Request:
    """A request walked along legal transitions to ``state``."""
    req = make_request()
    path = {
        S.QUEUED: [],
        S.PREFILLING: HAPPY_PATH[:1],
        S.TRANSFERRING: HAPPY_PATH[:2],
        S.DECODE_QUEUED: HAPPY_PATH[:3],
        S.DECODING: HAPPY_PATH,
        S.PREEMPTED: [*HAPPY_PATH, S.PREEMPTED],
    }[state]
    for i, step in enumerate(path):
        req.advance(step, at=101.0 + i)
    assert req.state is state
    return req


# -- lifecycle --------------------------------------------------------------------------------------------


def test_full_lifecycle_records_timestamped_events() -> None:
    req = make_request(arrival=100.0)
    assert req.state is S.QUEUED
    assert req.events == [RequestEvent(S.QUEUED, 100.0)]
    for i, step in enumerate(HAPPY_PATH):
        req.advance(step, detail=f"step {i}", at=101.0 + i)
    req.advance(S.FINISHED_LENGTH, "max_tokens reached", at=110.0)

    assert [e.state for e in req.events] == [S.QUEUED, *HAPPY_PATH, S.FINISHED_LENGTH]
    assert [e.at for e in req.events] == [100.0, 101.0, 102.0, 103.0, 104.0, 110.0]
    assert req.events[2].detail == "step 1"
    assert req.state is S.FINISHED_LENGTH and req.state.finished
    assert req.finish_reason == "max_tokens reached"
    assert req.first_time(S.TRANSFERRING) == 102.0
    assert req.first_time(S.PREEMPTED) is None


def test_default_timestamps_are_wall_clock_and_ordered() -> None:
    req = Request("r", (7,))
    for step in HAPPY_PATH:
        req.advance(step)
    req.finish(S.FINISHED_STOPPED)
    times = [e.at for e in req.events]
    assert times == sorted(times)
    assert req.events[0].at == req.arrival_time
    assert req.finish_reason == "stopped"


def test_finished_at_prefill() -> None:
    req = request_in(S.PREFILLING)
    req.advance(S.FINISHED_STOPPED, at=200.0)
    assert req.state is S.FINISHED_STOPPED
    assert req.finish_reason == "stopped"
    assert req.first_time(S.TRANSFERRING) is None
    assert req.events[-1] == RequestEvent(S.FINISHED_STOPPED, 200.0, "")


def test_preemption_loop() -> None:
    req = request_in(S.DECODING)
    req.advance(S.PREEMPTED, at=120.0)
    req.advance(S.DECODING, at=121.0)
    req.finish(S.FINISHED_STOPPED, "eos", at=130.0)
    assert [e.state for e in req.events][-4:] == [S.DECODING, S.PREEMPTED, S.DECODING, S.FINISHED_STOPPED]
    assert req.first_time(S.DECODING) == 104.0  # the first entry, not the re-entry
    assert req.finish_reason == "eos"


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (S.QUEUED, S.TRANSFERRING),
        (S.QUEUED, S.DECODING),
        (S.QUEUED, S.QUEUED),
        (S.PREFILLING, S.DECODE_QUEUED),
        (S.PREFILLING, S.QUEUED),
        (S.TRANSFERRING, S.DECODING),
        (S.DECODE_QUEUED, S.PREEMPTED),
        (S.DECODING, S.DECODE_QUEUED),
        (S.PREEMPTED, S.DECODE_QUEUED),
    ],
)
def test_illegal_transition_names_both_states(start: RequestState, target: RequestState) -> None:
    req = request_in(start)
    before = list(req.events)
    with pytest.raises(ValueError, match=rf"{start.name} -> {target.name}") as err:
        req.advance(target)
    assert "r1" in str(err.value)
    assert req.events == before


@pytest.mark.parametrize("final", [S.FINISHED_STOPPED, S.FINISHED_LENGTH])
def test_finished_request_cannot_move_on(final: RequestState) -> None:
    req = request_in(S.DECODING)
    req.finish(final)
    with pytest.raises(ValueError, match=rf"{final.name} -> DECODING"):
        req.advance(S.DECODING)


@pytest.mark.parametrize(
    ("start", "final"),
    [
        (s, f)
        for s in (S.QUEUED, S.TRANSFERRING, S.DECODE_QUEUED, S.PREEMPTED)
        for f in (S.FINISHED_STOPPED, S.FINISHED_LENGTH)
    ],
)
def test_normal_finish_only_from_prefilling_or_decoding(start: RequestState, final: RequestState) -> None:
    req = request_in(start)
    with pytest.raises(ValueError, match=start.name):
        req.finish(final)
    with pytest.raises(ValueError, match=start.name):
        req.advance(final)
    assert req.state is start and req.finish_reason is None


def test_illegal_normal_finish_names_both_states() -> None:
    req = request_in(S.QUEUED)
    with pytest.raises(ValueError, match="QUEUED") as err:
        req.advance(S.FINISHED_LENGTH)
    assert "FINISHED_LENGTH" in str(err.value)


@pytest.mark.parametrize("state", NOT_FINISHED)
def test_finish_rejects_non_finished_state(state: RequestState) -> None:
    req = make_request()
    with pytest.raises(ValueError, match=f"{state.name} is not a finished state"):
        req.finish(state)


@pytest.mark.parametrize("final", [S.FINISHED_ABORTED, S.FINISHED_ERROR])
@pytest.mark.parametrize("start", NOT_FINISHED)
def test_abort_or_error_from_any_unfinished_state(start: RequestState, final: RequestState) -> None:
    req = request_in(start)
    req.advance(final, at=500.0)
    assert req.state is final
    assert req.finish_reason == final.name.removeprefix("FINISHED_").lower()
    assert req.events[-1].at == 500.0


@pytest.mark.parametrize("first", FINISHED)
def test_finishing_twice_keeps_the_first_outcome(first: RequestState) -> None:
    req = request_in(S.DECODING)
    req.finish(first, "first reason", at=300.0)
    events = list(req.events)
    req.finish(S.FINISHED_ERROR, "second reason", at=301.0)
    req.finish(S.FINISHED_ABORTED, at=302.0)
    req.advance(S.FINISHED_STOPPED, "third", at=303.0)
    assert req.state is first
    assert req.finish_reason == "first reason"
    assert req.events == events


def test_empty_prompt_rejected() -> None:
    with pytest.raises(ValueError, match="prompt"):
        Request("r", ())


def test_given_events_are_kept() -> None:
    events = [RequestEvent(S.QUEUED, 1.0), RequestEvent(S.PREFILLING, 2.0)]
    req = Request("r", (1,), events=events)
    assert req.state is S.PREFILLING
    assert req.events == events


def test_state_order_and_finished_flag() -> None:
    assert [s.name for s in S if s.finished] == [
        "FINISHED_STOPPED",
        "FINISHED_LENGTH",
        "FINISHED_ABORTED",
        "FINISHED_ERROR",
    ]
    assert list(S) == sorted(S)


# -- sampling and SLO ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
    ],
)
def test_sampling_spec_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingSpec(**{field: value})


def test_sampling_spec_edges_are_valid() -> None:
    SamplingSpec(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0)
    spec = SamplingSpec(temperature=2.0, top_p=0.01, top_k=50, seed=3, stop_token_ids=(1, 2), ignore_eos=True)
    assert spec.stop_token_ids == (1, 2)
    with pytest.raises(AttributeError):
        spec.max_tokens = 3  # type: ignore[misc]


@pytest.mark.parametrize("field", ["ttft_ms", "tbt_ms", "jct_ms"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_slo_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"SLO\.{field}"):
        SLO(**{field: value})


def test_slo_defaults_and_valid_values() -> None:
    assert SLO() == SLO(None, None, None)
    slo = SLO(ttft_ms=200, tbt_ms=50, jct_ms=10_000)
    assert (slo.ttft_ms, slo.tbt_ms, slo.jct_ms) == (200, 50, 10_000)


# -- length estimates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("lower", "estimate", "upper"), [(5, 4, 10), (0, 11, 10), (-1, 0, 10), (3, 2, 1)])
def test_length_estimate_ordering_invariant(lower: int, estimate: int, upper: int) -> None:
    with pytest.raises(ValueError, match="lower <= estimate <= upper"):
        LengthEstimate(lower, estimate, upper)


@pytest.mark.parametrize("confidence", [-0.01, 1.01])
def test_length_estimate_confidence_range(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence"):
        LengthEstimate(0, 1, 2, confidence=confidence)


def test_length_estimate_round_trip_and_defaults() -> None:
    est = LengthEstimate(10, 40, 128, bucket=3, confidence=0.75, source="bucket-quantile")
    assert est.to_dict() == {
        "lower": 10,
        "estimate": 40,
        "upper": 128,
        "bucket": 3,
        "confidence": 0.75,
        "source": "bucket-quantile",
    }
    assert LengthEstimate.from_dict(est.to_dict()) == est
    minimal = LengthEstimate.from_dict({"lower": 0, "estimate": 0, "upper": 0})
    assert minimal == LengthEstimate(0, 0, 0, -1, 0.0, "unknown")
    coerced = LengthEstimate.from_dict({"lower": "1", "estimate": 2.0, "upper": "3", "confidence": "0.5"})
    assert (coerced.lower, coerced.estimate, coerced.upper, coerced.confidence) == (1, 2, 3, 0.5)
    with pytest.raises(ValueError, match="lower <= estimate <= upper"):
        LengthEstimate.from_dict({"lower": 9, "estimate": 2, "upper": 3})


def test_length_estimate_is_heavy() -> None:
    est = LengthEstimate(0, 128, 512)
    assert est.is_heavy(128) and not est.is_heavy(129)


# -- cluster config -------------------------------------------------------------------------------------------


def test_config_defaults() -> None:
    cfg = ClusterConfig.load()
    assert cfg == ClusterConfig()
    assert cfg.prefill.chunk_size >= cfg.engine.block_size


def test_config_from_yaml_with_dotted_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "num_prefill: 2\n"
        "engine:\n  max_model_len: 4096\n  block_size: 16\n"
        "prefill:\n  chunk_size: 256\n  dispatch_policy: random\n"
    )
    cfg = ClusterConfig.load(
        path,
        {
            "engine.max_model_len": 1024,
            "prefill.sched_batch": 4,
            "decode.admission.policy": None,  # None means "flag not given": ignored
            "num_decode": 3,
            "transport.timeout_s": 2.5,
        },
    )
    assert (cfg.num_prefill, cfg.num_decode) == (2, 3)
    assert cfg.engine.max_model_len == 1024 and cfg.engine.block_size == 16
    assert cfg.prefill.chunk_size == 256 and cfg.prefill.sched_batch == 4 and cfg.prefill.dispatch_policy == "random"
    assert cfg.decode.admission.policy == "greedy"
    assert cfg.transport.timeout_s == 2.5
    with pytest.raises(ValidationError):
        cfg.num_prefill = 5  # type: ignore[misc]


def test_config_overrides_create_missing_sections() -> None:
    cfg = ClusterConfig.load(None, {"prefill.chunk_size": 64, "engine.block_size": 64})
    assert cfg.prefill.chunk_size == 64 and cfg.engine.block_size == 64


def test_config_empty_yaml_is_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert ClusterConfig.load(path) == ClusterConfig()


def test_config_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="top level must be a mapping"):
        ClusterConfig.load(path)


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "loc"),
    [
        ("bogus: 1\n", {}, "bogus"),
        ("engine:\n  not_a_field: 2\n", {}, "not_a_field"),
        ("", {"prefill.chunk_sizes": 64}, "chunk_sizes"),
        ("", {"decode.extra": True}, "extra"),
    ],
)
def test_config_unknown_keys_rejected(tmp_path: Path, yaml_text: str, overrides: dict[str, object], loc: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValidationError, match=loc) as err:
        ClusterConfig.load(path, overrides)
    assert "Extra inputs are not permitted" in str(err.value)


def test_config_chunk_size_below_block_size_rejected() -> None:
    with pytest.raises(ValueError, match=r"prefill\.chunk_size must be >= engine\.block_size"):
        ClusterConfig.load(None, {"engine.block_size": 64, "prefill.chunk_size": 32})


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"num_prefill": 0}, "num_prefill"),
        ({"engine.max_model_len": 8}, "max_model_len"),
        ({"prefill.dispatch_policy": "fastest"}, "dispatch_policy"),
        ({"transport": "rdma"}, "transport"),
        ({"grpc_port": 70000}, "grpc_port"),
        ({"engine.gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_config_field_validation_names_the_field(overrides: dict[str, object], loc: str) -> None:
    with pytest.raises(ValidationError, match=loc):
        ClusterConfig.load(None, overrides)


def test_every_config_field_has_a_description() -> None:
    from tetriserve.common.admission_config import AdmissionConfig
    from tetriserve.common.config import DecodeConfig, EngineConfig
    from tetriserve.common.flip_config import FlipConfig, ScaleConfig
    from tetriserve.common.prefill_config import PrefillConfig

    for model in (ClusterConfig, EngineConfig, PrefillConfig, DecodeConfig, AdmissionConfig, FlipConfig, ScaleConfig):
        for name, info in model.model_fields.items():
            if name in ("engine", "prefill", "decode"):
                continue  # nested sections are documented by their own model
            assert info.description, f"{model.__name__}.{name} has no description"


# -- errors ----------------------------------------------------------------------------------------------------


def test_invalid_request_error() -> None:
    err = InvalidRequestError("max_tokens", "must be >= 1")
    assert isinstance(err, ValueError)
    assert (err.field, err.message, str(err)) == ("max_tokens", "must be >= 1", "max_tokens: must be >= 1")


def test_unknown_model_error() -> None:
    err = UnknownModelError("gpt-9", "tiny")
    assert isinstance(err, InvalidRequestError) and err.field == "model"
    assert "gpt-9" in str(err) and "tiny" in str(err)
