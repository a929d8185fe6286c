"""`tetriserve profile` like a user runs it: a tiny sweep on the tiny model, then read what it wrote."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("e2e profile test needs vllm", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "tetriserve.cli.main"]


def test_profile_writes_json_png_and_markdown(tmp_path: Path) -> None:
    from tetriserve.common.cost_profile import CostProfile

    out = tmp_path / "profile.json"
    report = tmp_path / "report"
    cmd = [*CLI, "profile", "--max-forward", "128", "--repeats", "1", "--enforce-eager", "--no-progress"]
    cmd += ["--out", str(out), "--report-dir", str(report), "--hardware", "test-cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "S_pf" in done.stdout and "held-out" in done.stdout

    prof = CostProfile.load(out)
    assert prof.hardware == "test-cpu" and prof.model == "tiny-llama"
    assert [p.forward_tokens for p in prof.sweep] == [16, 24, 32, 48, 64, 96, 128]
    assert prof.pivot_tokens in {p.forward_tokens for p in prof.sweep} and prof.pivot_seconds > 0
    assert prof.prefill.predict([(0, 64)]) > 0 and prof.decode.predict([64, 64]) > 0
    assert prof.prefill_fit_error < 1.0 and prof.decode_fit_error < 1.0  # a fit, not noise: errors below 100%
    assert prof.scls is not None and prof.scls.serving.t_serve(2, 64, 16) > 0  # SCLS eq. 1–4 fitted too
    assert prof.scls.kv_bytes_per_token > 0 and prof.scls.kv_pool_bytes > 0  # its Δ and M_ava
    assert "SCLS eq. 3" in done.stdout

    png = report / "profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (report / "profile.md").read_text()
    assert md.startswith("# Cost profile: tiny-llama on test-cpu")
    assert "Command: `tetriserve profile --out" in md and "S_pf = **" in md and "| 128 |" in md.replace("**", "")
