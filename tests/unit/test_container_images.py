"""The container images install the way CI does, and the chart and the docs name the images they build.

No container runtime runs here, so no image is built in CI. What can be checked without one is checked: each
Dockerfile is multi-stage, pinned, installs through ``scripts/setup.sh`` (the script CI runs, so its test covers
the images' install), runs as a non-root user with ``tetriserve`` on PATH; the Helm chart's default image is the
one the docs' build command tags, and the docs say the images are not built in CI.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cpu": ROOT / "docker" / "cpu.Dockerfile", "cuda": ROOT / "docker" / "cuda.Dockerfile"}
IMAGES_PAGE = ROOT / "docs" / "deployment" / "images.md"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip()
    ]


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_each_image_is_multi_stage_and_installs_through_the_setup_script(flavour: str) -> None:
    steps = _instructions(DOCKERFILES[flavour])
    froms = [args for op, args in steps if op == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    for base in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.split()[0])
        assert ":" in image and not image.endswith(":latest"), f"base image not pinned: {image}"
    runs = [a for op, a in steps if op == "RUN"]
    engine = "gpu" if flavour == "cuda" else "cpu"
    assert any(re.search(rf"scripts/setup\.sh --engine {engine}\b", r) for r in runs), runs
    assert not any("pip install" in r for r in runs), "every package comes through scripts/setup.sh"
    copied = [a for op, a in steps if op == "COPY" and "--from=" in a]
    assert copied, "the runtime stage takes the installed tree from the build stage"
    env = " ".join(a for op, a in steps if op == "ENV")
    assert "/opt/tetriserve/.venv/bin" in env, "tetriserve on PATH"
    users = [a for op, a in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0"), "runs as a non-root user"


def test_the_setup_script_takes_the_engine_the_images_ask_for() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "--engine" in setup and "TORCH_INDEX_URL" in setup


def _build_tags() -> dict[str, str]:
    text = IMAGES_PAGE.read_text()
    tags = {}
    for flavour, path in DOCKERFILES.items():
        m = re.search(rf"docker build -f docker/{path.name} -t (\S+) \.", text)
        assert m, f"{IMAGES_PAGE.name} gives no build command for {path.name}"
        tags[flavour] = m.group(1)
    return tags


def test_the_chart_defaults_to_the_image_the_docs_build() -> None:
    values = yaml.safe_load((ROOT / "helm" / "tetriserve" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm" / "tetriserve" / "Chart.yaml").read_text())
    image = f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"
    assert image == _build_tags()["cpu"]


def test_each_dockerfile_names_the_tag_the_docs_build() -> None:
    for flavour, tag in _build_tags().items():
        assert f"-t {tag} ." in DOCKERFILES[flavour].read_text(), flavour


def test_the_docs_say_the_images_are_not_built_in_ci() -> None:
    assert re.search(r"not built in CI", IMAGES_PAGE.read_text())
