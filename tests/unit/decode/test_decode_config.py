"""The decode section's policy settings (common/config.py, decode_worker/policy.py): each policy's parameters
live with it under ``decode.admission``, one of another policy is refused, and the old flat keys are refused
naming the new ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tetriserve.common.config import ClusterConfig, DecodeConfig
from tetriserve.decode_worker.admission.cacheopt import CacheOptAdmission
from tetriserve.decode_worker.admission.reserve_dynamic import ReserveDynamic
from tetriserve.decode_worker.policy import decode_policies, decode_policy_settings, updated_decode_config


def test_the_policy_is_built_with_its_own_parameters() -> None:
    cfg = DecodeConfig.model_validate({"admission": {"policy": "reserve-dynamic", "horizons": "shortest"}})
    admission, _, _ = decode_policies(cfg)
    assert isinstance(admission, ReserveDynamic) and admission.horizons == "shortest" and admission.end == "lower"
    cfg = DecodeConfig.model_validate({"admission": {"policy": "cacheopt", "reserve_blocks": 12}})
    admission, _, _ = decode_policies(cfg)
    assert isinstance(admission, CacheOptAdmission) and admission.reserve_blocks == 12
    assert admission.proactive_iters == 2 and admission.basic_tokens == 8  # CacheOpt §5: m = 2, B = 8 tokens
    assert decode_policy_settings(cfg)["admission.reserve_blocks"] == "12"
    assert "admission.horizons" not in decode_policy_settings(cfg)  # only the policy in force's parameters


def test_a_parameter_of_another_policy_is_refused_naming_its_policy() -> None:
    with pytest.raises(ValueError, match=r"decode\.admission\.horizons: a parameter of reserve-dynamic; the admission"):
        DecodeConfig.model_validate({"admission": {"policy": "greedy", "horizons": "shortest"}})
    with pytest.raises(ValueError, match="a parameter of reserve-static and reserve-dynamic"):
        DecodeConfig.model_validate({"admission": {"policy": "cacheopt", "length_end": "upper"}})
    # its default is no setting of another policy: a config written out whole reads back
    assert ClusterConfig.model_validate(ClusterConfig().model_dump()) == ClusterConfig()
    DecodeConfig.model_validate({"admission": {"policy": "greedy", "reserve_blocks": 8}})  # CacheOpt §5's 8


def test_a_run_time_switch_drops_the_parameters_the_new_policy_does_not_take() -> None:
    cfg = DecodeConfig.model_validate({"admission": {"policy": "cacheopt", "reserve_blocks": 12}})
    greedy = updated_decode_config(cfg, {"admission.policy": "greedy"})
    # back to the default, CacheOpt §5's 8 blocks
    assert greedy.admission.policy == "greedy" and greedy.admission.reserve_blocks == 8
    literal = updated_decode_config(greedy, {"admission.policy": "reserve-dynamic", "admission.horizons": "shortest"})
    assert literal.admission.horizons == "shortest"
    with pytest.raises(ValueError, match=r"^decode\.admission\.horizons: a parameter of reserve-dynamic; the adm"):
        updated_decode_config(greedy, {"admission.horizons": "shortest"})
    with pytest.raises(ValueError, match=r"^decode\.admission\.reserve_blocks: a parameter of cacheopt"):
        updated_decode_config(cfg, {"admission.policy": "greedy", "admission.reserve_blocks": 12})
    with pytest.raises(ValueError, match=r"decode\.admission\.policy: Input should be"):
        updated_decode_config(greedy, {"admission.policy": "lifo"})


def test_a_policy_given_over_a_file_leaves_the_files_parameters_of_another_policy_behind(tmp_path: Path) -> None:
    path = tmp_path / "preset.yaml"
    path.write_text("decode:\n  admission: {policy: cacheopt, reserve_blocks: 12}\n")
    assert ClusterConfig.load(path).decode.admission.reserve_blocks == 12
    cfg = ClusterConfig.load(path, {"decode.admission.policy": "greedy"})
    # back to the default, CacheOpt §5's 8 blocks
    assert cfg.decode.admission.policy == "greedy" and cfg.decode.admission.reserve_blocks == 8
    with pytest.raises(ValueError, match="a parameter of cacheopt"):  # given with the switch: refused
        ClusterConfig.load(path, {"decode.admission.policy": "sola", "decode.admission.reserve_blocks": 6})


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("admission_policy", "decode.admission.policy"),
        ("cacheopt_reserve_blocks", "decode.admission.reserve_blocks"),
        ("preemption_order", "decode.preemption.order"),
        ("preemption_profile", "decode.preemption.profile"),
    ],
)
def test_a_file_with_an_old_flat_key_is_refused_naming_the_new_one(tmp_path: Path, old: str, new: str) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(f"decode:\n  {old}: x\n")
    with pytest.raises(ValueError, match=f"config key decode.{old} is now {new}"):
        ClusterConfig.load(path)


def test_tetriinfer_s_literal_reserve_dynamic_from_a_config_file_admits_and_denies_on_a_block_pool(
    tmp_path: Path,
) -> None:
    from tests.unit.decode.test_admission import BS, req, run
    from tetriserve.decode_worker.views import DecodeState

    path = tmp_path / "tetriinfer.yaml"
    path.write_text("decode:\n  admission: {policy: reserve-dynamic, horizons: shortest}\n")
    admission, _, _ = decode_policies(ClusterConfig.load(path).decode)
    # the batch: r1 has 20 tokens left, r2 100, so the horizon k = 20 (the shortest job's end, §3.4);
    # 16-token blocks, 8 free; r1 48 → 68 tokens (3 → 5 blocks), r2 64 → 84 (4 → 6): capacity 8 + 3 + 4 = 15
    state = DecodeState(free_blocks=8, block_size=BS, running=(run("r1", 48, lower=20), run("r2", 64, lower=100)))
    assert admission.admit(req("n", 40, lower=200), state)  # 40 + 20 = 60 tokens = 4 blocks: 5 + 6 + 4 = 15 ≤ 15
    assert not admission.admit(req("m", 49, lower=200), state)  # 69 tokens = 5 blocks: 16 > 15
