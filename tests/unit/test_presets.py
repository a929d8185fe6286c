"""Presets (``common/presets.py``): a paper's configuration under the explicit one, from the config file, the CLI
and the Helm chart; listed by ``serve --preset``; documented key by key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests import helm_support as hs
from tetriserve.cli.main import main
from tetriserve.common.config import ClusterConfig
from tetriserve.common.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def _at(config: ClusterConfig, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_sets_what_it_names_in_each_of_its_modes(name: str) -> None:
    preset = PRESETS[name]
    assert ClusterConfig.load(overrides={"preset": name}).mode == preset.modes[0]
    for mode in preset.modes:
        config = ClusterConfig.load(overrides={"preset": name, "mode": mode})
        assert config.preset == name and config.mode == mode
        for dotted, value in preset.settings.items():
            assert _at(config, dotted) == value, dotted


def test_the_tetriinfer_preset_is_the_paper_s_evaluation_setup() -> None:
    # TetriInfer §5: SJF with PrefillSchedBatch 16, ChunkSize 512, power-of-two dispatch, reserve-dynamic as §3.4
    # writes it, every prompt on a prefill worker, idle flips after a minute, a 200 Gb/s link
    c = ClusterConfig.load(overrides={"preset": "tetriinfer"})
    assert (c.mode, c.prefill.queue_policy, c.prefill.sched_batch, c.prefill.chunk_size) == (
        "disaggregated",
        "sjf",
        16,
        512,
    )
    assert (c.decode.admission.policy, c.decode.admission.horizons) == ("reserve-dynamic", "shortest")
    assert (c.prefill.offload_max_tokens, c.prefill.offload_wait_s, c.decode.max_local_prompts) == (0, 0, 0)
    assert (c.flip.policy, c.flip.interval_s) == ("tetriinfer", 60.0)
    assert c.transport.emulate is not None and c.transport.emulate.gbps == 200.0


def test_explicit_settings_win_over_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("preset: tetriinfer\nprefill:\n  sched_batch: 128\n")
    c = ClusterConfig.load(path, {"prefill.chunk_size": 256})
    assert (c.prefill.sched_batch, c.prefill.chunk_size, c.prefill.queue_policy) == (128, 256, "sjf")
    # an admission policy of one's own replaces the preset's admission section whole: horizons is
    # reserve-dynamic's, and greedy takes no parameters
    c = ClusterConfig.load(overrides={"preset": "tetriinfer", "decode.admission.policy": "greedy"})
    assert (c.decode.admission.policy, c.decode.admission.horizons) == ("greedy", "all")
    # the flag names the preset, the file the rest
    path.write_text("num_decode: 2\n")
    c = ClusterConfig.load(path, {"preset": "sola"})
    assert (c.num_decode, c.mode, c.prefill.chunking) == (2, "colocated", "sola")


def test_a_mode_the_preset_does_not_serve_in_and_an_unknown_preset_are_refused() -> None:
    with pytest.raises(ValueError, match="preset tetriinfer serves in disaggregated mode, not colocated"):
        ClusterConfig.load(overrides={"preset": "tetriinfer", "mode": "colocated"})
    with pytest.raises(ValueError, match="preset: unknown 'vllm'; known: tetriinfer, accelgen"):
        ClusterConfig.load(overrides={"preset": "vllm"})


def test_serve_preset_without_a_name_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--preset"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(PRESETS)
    assert lines[0].startswith("tetriinfer  TetriInfer §3.2–§3.5, §5; disaggregated only.")
    with pytest.raises(SystemExit):
        main(["serve", "--preset", "bogus"])


def test_the_docs_page_shows_every_setting_of_every_preset() -> None:
    text = (ROOT / "docs" / "policies" / "presets.md").read_text()
    for name, preset in PRESETS.items():
        section = re.search(rf"^## `{name}`\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        assert section is not None, name
        for dotted, value in preset.settings.items():
            shown = f"{value:g}" if isinstance(value, float) else value
            assert f"`{dotted}: {shown}`" in section.group(1), (name, dotted, shown)


def test_the_helm_value_passes_the_preset_to_serve() -> None:
    def head_args(values: dict[str, Any]) -> list[str]:
        (cluster,) = hs.of_kind(hs.manifests(hs.render(values)), "RayCluster")
        args: list[str] = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["args"]
        return args

    args = head_args({"serve": {"preset": "cacheopt"}})
    assert args[args.index("--preset") + 1] == "cacheopt"
    assert "--preset" not in head_args({})
