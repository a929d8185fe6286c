"""A plain vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on the tiny model: the
reference the front door's answers are compared with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def plain_vllm(model_path: str, log: Path, args: Sequence[str] = (), start_s: float = 300) -> Iterator[str]:
    """Run the server (model served as ``tiny-llama``, 1 OMP thread, output to ``log``) until the ``with``
    ends; yields its URL."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        "tiny-llama",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + start_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"plain vLLM server exited with {proc.returncode} (log: {log})")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain vLLM server not up within {start_s:.0f} s (log: {log})")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
