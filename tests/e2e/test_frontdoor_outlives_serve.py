"""Front doors outlive each other, on a Ray cluster started apart from the service (`ray start`, as
on Kubernetes): `serve --address` killed outright (SIGKILL) leaves the control plane, the workers and a
`tetriserve frontdoor` serving; `tetriserve stop` then ends the service and the front door exits."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cli_support import CLI, ROOT, field, start

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None:
    pytest.skip("e2e tests need vllm and ray", allow_module_level=True)


def _complete(http: str) -> dict[str, object]:
    import httpx

    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 5, "ignore_eos": True, "temperature": 0}
    reply = httpx.post(f"{http}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop_ray(temp_dir: Path) -> None:
    """Stop the Ray instance under ``temp_dir`` alone (``ray stop`` would stop every one on this machine)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(temp_dir) in " ".join(proc.info["cmdline"] or ()):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def test_a_front_door_outlives_a_killed_serve_and_tetriserve_stop_ends_the_service(tmp_path: Path) -> None:
    temp_dir = Path("/tmp") / f"tetriserve-e2e-{os.getpid()}"  # short: Ray's socket paths must fit 107 bytes
    gcs = f"127.0.0.1:{_free_port()}"
    ray_start = [
        *(sys.executable, "-m", "ray.scripts.scripts", "start", "--head"),
        *(f"--port={gcs.rsplit(':', 1)[1]}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}"),
        *(f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}"),
        *(f"--metrics-export-port={_free_port()}", "--include-dashboard=false", "--disable-usage-stats"),
    ]
    # Ray's workers start at nice 15 by default; in a pod they have its cores to themselves, here they share the
    # machine with the other tests (``scripts/test.sh`` runs the unit tests beside these), so at nice 0 as in `serve`
    env = {**os.environ, "RAY_worker_niceness": "0"}
    started = subprocess.run(ray_start, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    serve = door = None
    try:
        flags = ["--grpc-port", "0", "--http-port", "0", "--kv-cache-gb", "0.5", "--enforce-eager"]
        serve, serve_lines = start(["serve", "--address", gcs, *flags], r"Ctrl-C stops", 300)
        field(serve_lines, r"OpenAI HTTP\s+(\S+)/v1")
        door, door_lines = start(
            ["frontdoor", "--address", gcs, "--grpc-port", "0", "--http-port", "0"], r"Ctrl-C stops", 120
        )
        http = field(door_lines, r"OpenAI HTTP\s+(\S+)/v1")
        first = _complete(http)

        os.kill(serve.pid, signal.SIGKILL)  # as if its process crashed
        serve.wait(30)
        again = _complete(http)  # the control plane and the workers go on, behind the other front door
        assert again["choices"] == first["choices"]  # type: ignore[index]

        stop = subprocess.run([*CLI, "stop", "--address", gcs], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert door.wait(60) == 0, "".join(door_lines[-30:])
        assert "the service was stopped" in "".join(door_lines)
    finally:
        for proc in (door, serve):
            if proc is not None and proc.poll() is None:
                proc.kill()
        _stop_ray(temp_dir)
