"""What a user installs: one `tetriserve` namespace and nothing generic at the top level; the gRPC SDK alone.

Both distributions are built as wheels from this checkout. The SDK's wheel is
installed into a fresh virtual environment with nothing but its own
dependencies (grpcio, protobuf) and talks to a running gRPC front door.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("cli", "client", "common", "control_plane", "decode_worker", "engine", "frontdoor", "length_predictor",
           "observability", "prefill_worker", "protos", "transport", "worker")  # fmt: skip


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    src = tmp_path_factory.mktemp("src") / "tetriserve"  # a copy: an in-tree build would leave build/ behind
    skip = (".venv", ".git", "build", "benchmarks", "tests", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip))
    for project in (src / "sdk", src):
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*pip, "-w", str(out), str(project)], check=True, cwd=out)
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"tetriserve", "tetriserve_client"}, found
    return found


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist()}


def test_nothing_generic_is_installed_at_the_top_level(wheels: dict[str, Path]) -> None:
    for name, wheel in wheels.items():
        tops = _top_level(wheel)
        assert {t for t in tops if not t.endswith(".dist-info")} == {"tetriserve"}, (name, tops)
    with zipfile.ZipFile(wheels["tetriserve"]) as z:
        names = z.namelist()
    assert "tetriserve/cli/main.py" in names and "tetriserve/__init__.py" not in names  # a namespace
    assert not any(n.startswith(("tetriserve/client/", "tetriserve/protos/")) for n in names)  # the SDK's
    for top in set(GENERIC) - {"client", "protos"}:  # every subpackage (setuptools lists them by name)
        for init in (ROOT / top).rglob("__init__.py"):
            assert f"tetriserve/{init.relative_to(ROOT).as_posix()}" in names, init
    # and in this environment, from a directory that is not the checkout, only the namespace imports
    probe = f"import importlib.util as u; print([m for m in {GENERIC!r} if u.find_spec(m)])"
    found = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    assert found.stdout.strip() == "[]"
    subprocess.run([sys.executable, "-I", "-c", "import tetriserve.cli.main"], check=True, cwd="/")


@pytest.fixture(scope="module")
def grpc_target() -> Iterator[str]:
    from tests.fakes import FakeBackend, LoopThread, tokenizer_dir
    from tetriserve.frontdoor.core import FrontDoor
    from tetriserve.frontdoor.gateway_grpc import start_grpc_server

    backend = FakeBackend(tokenizer_dir())
    loop = LoopThread()
    server, port = loop.run(start_grpc_server(backend, "127.0.0.1", 0, front=FrontDoor(backend)))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.run(server.stop(None))
        loop.stop()


def test_the_sdk_installs_alone_and_talks_to_a_running_service(
    wheels: dict[str, Path], grpc_target: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheels["tetriserve_client"])], check=True)
    installed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    names = {line.split("==")[0].lower() for line in installed.stdout.split()}
    assert {"tetriserve-client", "grpcio", "protobuf"} <= names
    assert not names & {"tetriserve", "ray", "torch", "vllm", "transformers", "numpy"}, names
    script = textwrap.dedent(
        f"""
        from tetriserve.client import TetriServeClient
        with TetriServeClient({grpc_target!r}, timeout=30) as client:
            done = client.complete([5, 6, 7], max_tokens=3)
            print(done.finish_reason, list(done.token_ids))
        """
    )
    out = subprocess.run([str(py), "-I", "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split()[0] == "length" and out.stdout.strip().endswith("[5, 6, 7]")
