"""A plain vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on the tiny model: the
reference the front door's answers are compared with.

Its start is slow, mostly vLLM's imports. ``prestart`` begins it early at the lowest priority, on what the tests
before it leave idle; ``plain_vllm`` then takes over that server (same model and arguments) instead of starting one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PlainVllm:
    """One server process (model served as ``tiny-llama``, 1 OMP thread, output to ``log``) at ``niceness``."""

    def __init__(self, model_path: str, log: Path, args: Sequence[str] = (), niceness: int = 0) -> None:
        port = _free_port()
        cmd = [
            *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path),
            *("--served-model-name", "tiny-llama", "--host", "127.0.0.1", "--port", str(port)),
            "--disable-uvicorn-access-log",
            *args,
        ]
        if niceness:
            cmd = ["nice", "-n", str(niceness), *cmd]  # nice execs the server: the same process
        env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.niceness = niceness
        with open(log, "wb") as out:
            # in the tests' own session: with the kernel's autogroup scheduling, a niceness counts only against
            # the processes of the same session
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def ready(self, start_s: float) -> str:
        """Wait until it answers /health (at normal priority from now on); its URL."""
        if self.niceness:
            self._renice(0)
        deadline = time.monotonic() + start_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"plain vLLM server exited with {self.proc.returncode} (log: {self.log})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain vLLM server not up within {start_s:.0f} s (log: {self.log})")
            time.sleep(1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _renice(self, niceness: int) -> None:
        """Every thread of its process tree (on Linux a niceness is a thread's)."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            for proc in (root, *root.children(recursive=True)):
                for thread in proc.threads():
                    os.setpriority(os.PRIO_PROCESS, thread.id, niceness)
        except (psutil.Error, OSError):  # gone, or not ours to raise: it runs on at its niceness
            pass


_prestarted: dict[tuple[str, ...], PlainVllm] = {}


def prestart(model_path: str, args: Sequence[str] = ()) -> None:
    """Start a server for ``plain_vllm(model_path, ..., args)`` now, at the lowest priority."""
    key = (model_path, *args)
    if key not in _prestarted:
        log = Path(tempfile.mkdtemp(prefix="plain-vllm-")) / "server.log"
        _prestarted[key] = PlainVllm(model_path, log, args, niceness=19)


def stop_prestarted() -> None:
    """Stop the prestarted servers no test took over."""
    while _prestarted:
        _prestarted.popitem()[1].stop()


@contextmanager
def plain_vllm(model_path: str, log: Path, args: Sequence[str] = (), start_s: float = 300) -> Iterator[str]:
    """Run the server (a prestarted one for the same model and ``args`` if there is one, else a new one with its
    output to ``log``) until the ``with`` ends; yields its URL."""
    server = _prestarted.pop((model_path, *args), None) or PlainVllm(model_path, log, args)
    try:
        yield server.ready(start_s)
    finally:
        server.stop()
