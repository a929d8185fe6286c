"""Drive the product like a user: `tetriserve serve`, then `generate`, `status`, the openai client and
vLLM's own benchmark client against it, then SIGTERM under load (as Kubernetes stops a pod)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.cli_support import field, start

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None:
    pytest.skip("e2e tests need vllm and ray", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "tetriserve.cli.main"]


@dataclass
class Service:
    proc: subprocess.Popen[str]
    grpc: str
    http: str
    output: list[str]


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    cmd = [*CLI, "serve", "--grpc-port", "0", "--http-port", "0", "--kv-cache-gb", "0.5", "--enforce-eager"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    grpc = http = ""
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    banner_done = False
    while time.monotonic() < deadline and not banner_done:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if m := re.match(r"\s+gRPC\s+(\S+)", line):
            grpc = m.group(1)
        if m := re.match(r"\s+OpenAI HTTP\s+(\S+)/v1", line):
            http = m.group(1)
        banner_done = "Ctrl-C stops the service" in line
    if not (grpc and http):
        proc.kill()
        pytest.fail("serve did not print its endpoints:\n" + "".join(lines[-40:]))
    # keep reading, or the service blocks on a full pipe once its workers log enough
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    try:
        yield Service(proc, grpc, http, lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_serve_prints_endpoints_and_dashboard(service: Service) -> None:
    text = "".join(service.output)
    assert "Ray dashboard" in text
    assert "ready in" in text


def test_cli_generate_and_status(service: Service) -> None:
    out = subprocess.run(
        [*CLI, "generate", "Hello there", "--target", service.grpc, "--max-tokens", "8", "--ignore-eos"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "[finish: length" in out.stderr and "8 completion tokens" in out.stderr
    st = subprocess.run(
        [*CLI, "status", "--target", service.grpc, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert sorted(w["role"] for w in status["workers"]) == ["decode", "prefill"]
    assert status["model"] == "tiny-llama"


def test_official_openai_client(service: Service) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{service.http}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    done = client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=6, extra_body={"ignore_eos": True})
    assert done.usage is not None and done.usage.completion_tokens == 6
    pieces = list(
        client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
        )
    )
    assert pieces[-1].choices[0].finish_reason in ("length", "stop")


def test_vllm_benchmark_client(service: Service, tmp_path: Path) -> None:
    from tetriserve.cli.model_builder import default_tiny_model_dir
    from tetriserve.common.sharegpt import write_valid_json

    data = tmp_path / "sharegpt.json"
    write_valid_json(data, limit=400)
    code = (
        "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
        "from vllm.benchmarks.serve import add_cli_args, main; p = P(); add_cli_args(p); "
        "main(p.parse_args(sys.argv[1:]))"
    )
    cmd = [
        sys.executable,
        "-c",
        code,
        "--backend",
        "openai",
        "--base-url",
        service.http,
        "--model",
        "tiny-llama",
        "--tokenizer",
        str(default_tiny_model_dir()),
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(data),
        "--num-prompts",
        "12",
        "--request-rate",
        "4",
        "--seed",
        "0",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "r.json",
        "--save-detailed",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "r.json").read_text())
    errors = [e for e in result.get("errors", []) if e]
    assert result["completed"] == 12 and result.get("failed", 0) == 0, errors


def test_a_second_front_door_joins_serves_and_leaves_without_taking_the_service_along(service: Service) -> None:
    """`tetriserve frontdoor` joins the running service (the address serve prints); both front doors serve; SIGTERM
    to the second one ends it alone: the first and the workers go on serving."""
    import httpx

    joined = field(service.output, r"tetriserve frontdoor (--address \S+ --namespace \S+)").split()
    proc, lines = start(["frontdoor", *joined, "--grpc-port", "0", "--http-port", "0"], r"Ctrl-C stops", 120)
    try:
        http = field(lines, r"OpenAI HTTP\s+(\S+)/v1")
        assert http != service.http
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
        with httpx.Client(timeout=120) as client:
            texts = [client.post(f"{url}/v1/completions", json=body).json() for url in (http, service.http)]
            assert [t["usage"]["completion_tokens"] for t in texts] == [6, 6], texts
            assert texts[0]["choices"][0]["text"] == texts[1]["choices"][0]["text"]  # greedy: the same engines
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, "".join(lines[-30:])
            after = client.post(f"{service.http}/v1/completions", json=body)
            assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 6
        assert "the service keeps running" in "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_flipped_there_and_back_serves_every_request_of_this_front_door(service: Service) -> None:
    """`scale`, then `flip decode-1 prefill` and `flip decode-1 decode`: the front door keeps its stream from the
    worker across both flips (the worker is listed under another role, but it is the same actor), so requests
    handed to it in either role are served, none lost to a stream the front door took for down."""
    import httpx

    def cli(*args: str) -> None:
        done = subprocess.run([*CLI, *args, "--target", service.grpc], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    cli("scale", "--decode", "2")
    cli("flip", "decode-1", "prefill")
    cli("flip", "decode-1", "decode")
    bodies = [{"model": "tiny-llama", "prompt": f"flip {i} " * (4 + i), "max_tokens": 8, "ignore_eos": True}
              for i in range(12)]  # fmt: skip
    with httpx.Client(timeout=120) as client:
        replies = [client.post(f"{service.http}/v1/completions", json=b) for b in bodies]
    assert [r.status_code for r in replies] == [200] * 12, [r.text for r in replies if r.status_code != 200]
    assert {r.json()["usage"]["completion_tokens"] for r in replies} == {8}
    st = subprocess.run([*CLI, "status", "--target", service.grpc, "--json"], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    workers = {w["worker_id"]: w for w in json.loads(st.stdout)["workers"]}
    assert workers["decode-1"]["role"] == "decode" and workers["decode-1"]["flips"] == 2
    assert "decode-1 is down" not in "".join(service.output)


def test_sigterm_under_load_drains_loses_no_admitted_request_and_exits_cleanly(service: Service) -> None:
    """Kubernetes' way to stop a pod: SIGTERM to the main process only. Streams admitted before it run to their
    end; /ready turns 503 at once while /health stays 200; a new request is turned away with 503 draining."""
    import httpx

    body = {"model": "tiny-llama", "prompt": "Tell me a story.", "max_tokens": 48, "ignore_eos": True, "stream": True}
    first_tokens = threading.Barrier(5)
    outcomes: list[tuple[int, str | None, int]] = []

    def stream_one() -> None:
        with httpx.Client(timeout=120) as http, http.stream("POST", f"{service.http}/v1/completions", json=body) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 1:
                        first_tokens.wait(60)
            last = events[-1]["choices"][0] if events else {}
            outcomes.append((r.status_code, last.get("finish_reason"), len(events)))

    threads = [threading.Thread(target=stream_one) for _ in range(4)]
    for t in threads:
        t.start()
    first_tokens.wait(120)  # all four admitted and streaming
    os.kill(service.proc.pid, signal.SIGTERM)
    with httpx.Client(timeout=30) as http:
        deadline = time.monotonic() + 10
        while http.get(f"{service.http}/ready").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get(f"{service.http}/ready").status_code == 503
        assert http.get(f"{service.http}/health").status_code == 200
        late = http.post(f"{service.http}/v1/completions", json={**body, "stream": False})
        assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
    for t in threads:
        t.join(120)
    assert sorted(o[:2] for o in outcomes) == [(200, "length")] * 4, outcomes
    assert service.proc.wait(90) == 0
    deadline = time.monotonic() + 10
    while "shutting down" not in "".join(service.output) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "shutting down" in "".join(service.output)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--chunking", "dynamic", "--cost-profile", "/nonexistent/profile.json"], "run `tetriserve profile`"),
        (["--prefill-policy", "lifo"], "prefill.queue_policy"),
    ],
)
def test_serve_refuses_a_policy_it_cannot_build_before_starting_anything(flags: list[str], message: str) -> None:
    out = subprocess.run([*CLI, "serve", *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
