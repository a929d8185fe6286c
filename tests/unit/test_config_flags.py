"""`serve`'s flags come from the configuration models, `--set` reaches every key, and a renamed key is refused
with its new name (cli/config_flags.py, common/config_keys.py)."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import pytest

from tetriserve.cli import main as cli
from tetriserve.cli.config_flags import SERVE_FLAGS, add_config_flags, config_overrides, flag_help, parse_set
from tetriserve.common.config import ClusterConfig
from tetriserve.common.config_keys import RENAMED, holds_section, key_at, leaf_keys, sections


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return p


def test_every_config_field_and_section_has_a_description() -> None:
    missing = [k.path for k in leaf_keys(ClusterConfig) if not (k.field.description or "").strip()]
    for path, model in sections(ClusterConfig):
        missing += [
            f"{path}.{name}" if path else name
            for name, field in model.model_fields.items()
            if holds_section(field) and not (field.description or "").strip()
        ]
    assert not missing, f"config fields without a description: {missing}"


def test_every_flag_names_a_key_and_its_help_is_the_fields_description() -> None:
    parser = _serve_parser()
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for flag, path in SERVE_FLAGS.items():
        key = key_at(ClusterConfig, path)
        assert by_flag[flag].help == flag_help(key)
        assert " ".join((key.field.description or "").split()).replace("%", "%%") in by_flag[flag].help


def test_a_literal_key_offers_its_choices_and_a_bool_key_has_a_no_form() -> None:
    parser = _serve_parser()
    action = next(a for a in parser._actions if "--prefill-policy" in a.option_strings)
    assert tuple(action.choices) == typing.get_args(key_at(ClusterConfig, "prefill.queue_policy").annotation)
    with pytest.raises(SystemExit):
        parser.parse_args(["--prefill-policy", "lifo"])
    assert config_overrides(parser.parse_args(["--no-kv-pull", "--kv-pipeline"])) == {
        "transport.pull": False,
        "transport.pipeline": True,
    }


def test_flags_not_given_override_nothing() -> None:
    assert config_overrides(_serve_parser().parse_args([])) == {}


def test_set_reads_yaml_values_and_wins_over_a_flag() -> None:
    args = _serve_parser().parse_args(
        [
            "--max-model-len",
            "1024",
            "--set",
            "engine.max_model_len=4096",
            "--set",
            "decode.admission.reserve_blocks=8",
            "--set",
            "transport.pull=false",
            "--set",
            "security.api_keys=[a, b]",
            "--set",
            "flip.ttft_slo_ms=2.5",
        ]
    )
    assert config_overrides(args) == {
        "engine.max_model_len": 4096,
        "decode.admission.reserve_blocks": 8,
        "transport.pull": False,
        "security.api_keys": ["a", "b"],
        "flip.ttft_slo_ms": 2.5,
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("engine.max_model_len", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("engine.max_model_lenn=3", "did you mean engine.max_model_len"),
        ("nonsense.key=1", "unknown config key nonsense.key"),
        ("kv_transfer_timeout_s=5", "is now transport.timeout_s"),
        ("engine.max_model_len=[1", "not YAML"),
    ],
)
def test_set_refuses_what_is_not_a_key_naming_what_is(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_set(item)


def test_a_config_file_with_a_renamed_key_is_refused_naming_the_new_one(tmp_path: Path) -> None:
    for old, new in RENAMED.items():
        path = tmp_path / "cluster.yaml"
        *parents, leaf = old.split(".")  # nested sections as deep as the key goes
        nest = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
        path.write_text(f"{nest}{'  ' * len(parents)}{leaf}: 1.0\n")
        with pytest.raises(ValueError, match=f"{old} is now {new}"):
            ClusterConfig.load(path)
        key_at(ClusterConfig, new)  # the new key exists


def test_the_renamed_keys_hold_their_values_where_the_message_says() -> None:
    cfg = ClusterConfig.load(
        overrides={"transport.timeout_s": 12.0, "decode.slice_lambda": 0.25, "decode.slice_min_interval_s": 3.0}
    )
    assert (cfg.transport.timeout_s, cfg.decode.slice_lambda, cfg.decode.slice_min_interval_s) == (12.0, 0.25, 3.0)


def test_serve_help_is_generated_from_the_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--set KEY=VALUE" in out
    assert "Context length (prompt + output tokens). (default: 2048)" in out


def test_serve_refuses_an_unknown_set_key_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--set", "decode.admision_policy=greedy"]) == 2
    assert "did you mean decode.admission.policy" in capsys.readouterr().err


def test_set_gives_a_string_key_its_text_as_written() -> None:
    # YAML would read 2024 as a number and `no` as false; a name or a path is the text itself
    assert parse_set("engine.served_model_name=2024") == ("engine.served_model_name", "2024")
    assert parse_set("security.api_keys_file=no") == ("security.api_keys_file", "no")
    assert parse_set("engine.max_model_len=2024") == ("engine.max_model_len", 2024)


def test_a_tracing_endpoint_turns_tracing_on_by_flag_or_by_set_unless_told_not_to() -> None:
    parser = _serve_parser()
    assert config_overrides(parser.parse_args(["--set", "tracing.endpoint=http://c:4317"]))["tracing.enabled"]
    off = config_overrides(parser.parse_args(["--otlp-endpoint", "http://c:4317", "--no-tracing"]))
    assert off["tracing.enabled"] is False


def test_a_default_the_description_states_is_not_repeated() -> None:
    key = key_at(ClusterConfig, "engine.enforce_eager")  # its description names vLLM's default
    assert "(default:" not in flag_help(key)
    assert flag_help(key_at(ClusterConfig, "engine.max_model_len")).endswith("(default: 2048)")


def test_the_colocated_mode_runs_as_many_engines_and_refuses_flips() -> None:
    cfg = ClusterConfig.load(overrides={"mode": "colocated", "num_prefill": 2, "num_decode": 3})
    assert cfg.num_colocated == 5  # 2 + 3: the disaggregated mode's engines, each running both phases
    assert ClusterConfig().num_colocated == 0
    with pytest.raises(ValueError, match=r"flip\.policy: a colocated worker has no other role"):
        ClusterConfig.load(overrides={"mode": "colocated", "flip.policy": "tetriinfer"})
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert config_overrides(parser.parse_args(["--mode", "colocated"]))["mode"] == "colocated"
