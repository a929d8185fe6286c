"""`tetriserve profile`: calibrate the cost model on the real engine (SOLA §5.2, AccelGen §4.2, TetriInfer §3.3.3,
SCLS §4.2–§4.3).

    tetriserve profile [--model DIR] [--out FILE.json] [--report-dir DIR] [--max-forward 2048] [--repeats 3]
                       [--saturation 0.9] [--hardware NAME] [--dtype auto] [--threads 1] [--enforce-eager]

    resolve the model (the tiny one, built on first use, like `serve`) ─▶ engine.profiler (sweeps, timed)
      ─▶ engine.profile_fit (pivot, eq. 3 / eq. 4 on a train split, held-out error; SCLS eq. 3 / eq. 4 with the
         engine's Δ and M_ava)
      ─▶ CostProfile JSON (default $TETRISERVE_HOME/profiles/<model>--<hardware>.json)
      ─▶ engine.profile_report: <stem>.png + <stem>.md beside it (or in --report-dir)

This module only parses flags and wires those parts together.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tetriserve.engine.profile_fit import Calibration

_FLAGS: tuple[str, ...] = ("model", "out", "report_dir", "max_forward", "repeats", "saturation", "hardware", "dtype")


def add_profile_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", help="time the engine, fit the SOLA cost models, find the pivot chunk size")
    p.add_argument("--model", default=None, help="Hugging Face model directory (default: the tiny model)")
    p.add_argument("--out", default=None, help="profile JSON (default: $TETRISERVE_HOME/profiles/<model>--<hw>.json)")
    p.add_argument("--report-dir", default=None, help="where <stem>.png and <stem>.md go (default: beside --out)")
    p.add_argument("--max-forward", type=int, default=None, help="largest forward size swept, tokens (default 2048)")
    p.add_argument("--repeats", type=int, default=None, help="runs per scenario; the median is kept (default 3)")
    p.add_argument("--saturation", type=float, default=None, help="pivot: fraction of the best throughput (0.9)")
    p.add_argument("--hardware", default=None, help="hardware name in the profile (default: detected)")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"], help="dtype (auto)")
    p.add_argument("--threads", type=int, default=None, help="OMP/torch threads of the engine (default 1)")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile / CUDA graphs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _command(args: argparse.Namespace) -> str:
    """The command line as given (flags left at their defaults are omitted)."""
    parts = ["tetriserve", "profile"]
    for name in (*_FLAGS, "threads"):
        value = getattr(args, name)
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    parts += [f"--{flag}" for flag in ("enforce-eager", "no-progress") if getattr(args, flag.replace("-", "_"))]
    return shlex.join(parts)


def _model_max_len(model_dir: str) -> int:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings") or 2048)


def run_profile(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import resolve_model
    from tetriserve.common.config import ClusterConfig, EngineConfig
    from tetriserve.common.cost_profile import default_profile_path
    from tetriserve.engine.settings import engine_env

    max_forward = 2048 if args.max_forward is None else args.max_forward
    repeats = 3 if args.repeats is None else args.repeats
    saturation = 0.9 if args.saturation is None else args.saturation
    if max_forward < 16:
        raise ValueError(f"--max-forward must be >= 16, got {max_forward}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if not 0.0 < saturation <= 1.0:
        raise ValueError(f"--saturation must be in (0, 1], got {saturation}")
    threads = 1 if args.threads is None else args.threads
    os.environ.update(engine_env(EngineConfig(threads_per_engine=threads)))  # before torch / vllm load
    model_dir, name = resolve_model(ClusterConfig(engine=EngineConfig(model=args.model)))
    cfg = EngineConfig(
        model=model_dir,
        dtype=args.dtype or "auto",
        threads_per_engine=threads,
        enforce_eager=args.enforce_eager,
        # a prompt of max_forward tokens plus its one output token, within what the model allows
        max_model_len=min(_model_max_len(model_dir), max(2048, max_forward + 1)),
    )
    t0 = time.monotonic()
    from tetriserve.engine.hardware import detect_hardware
    from tetriserve.engine.profile_fit import calibrate
    from tetriserve.engine.profile_report import ReportContext, write_report
    from tetriserve.engine.profiler import ProfileEngine, measure, plan_scenarios

    engine = ProfileEngine.open(cfg, model_dir, max_forward)  # sets the engine's environment before vllm loads
    hardware = args.hardware or detect_hardware()
    # keyed like prefill_worker.policy.load_cost looks it up: the model directory's name and this hardware
    out = Path(args.out) if args.out else default_profile_path(model_dir, hardware)
    report_dir = Path(args.report_dir) if args.report_dir else out.parent
    scenarios = plan_scenarios(engine.facts, max_forward)
    t_measure = time.monotonic()
    steps = measure(engine, scenarios, repeats, progress=not args.no_progress)
    measure_s = time.monotonic() - t_measure
    f = engine.facts
    kv_pool = f.kv_capacity_tokens * f.kv_bytes_per_token  # SCLS eq. 6's M_ava, as vLLM sized the KV cache
    cal = calibrate(steps, name, hardware, saturation, f.kv_bytes_per_token, kv_pool)
    cal.profile.save(out)
    mode = "eager" if cfg.enforce_eager else "compiled"
    ctx = ReportContext(
        command=_command(args),
        engine=f"vLLM, dtype {f.dtype}, {cfg.threads_per_engine} thread(s), {mode}, max_model_len {f.max_model_len},"
        f" max_num_batched_tokens {f.max_batched_tokens}",
        repeats=repeats,
        runtime_s=measure_s,
        samples=f"{len(scenarios)} scenarios, {len(steps)} iterations",
    )
    png, md = write_report(cal, ctx, report_dir, out.stem)
    _summary(cal, out, png, md, time.monotonic() - t0)
    return 0


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def _summary(cal: Calibration, out: Path, png: Path, md: Path, seconds: float) -> None:
    p = cal.profile
    print(f"profile: {p.model} on {p.hardware} in {seconds:.0f} s")
    print(f"  pivot        S_pf = {p.pivot_tokens} tokens, T_pf = {1e3 * p.pivot_seconds:.2f} ms")
    print(f"  prefill      a0={p.prefill.a0:.3g} b0={p.prefill.b0:.3g} c0={p.prefill.c0:.3g} d0={p.prefill.d0:.3g}")
    print(f"  decode       a1={p.decode.a1:.3g} b1={p.decode.b1:.3g} c1={p.decode.c1:.3g}")
    if p.scls is not None and cal.scls_errors is not None:
        s = p.scls.serving
        print(f"  SCLS eq. 3   p1={s.p1:.3g} p2={s.p2:.3g} p3={s.p3:.3g} p4={s.p4:.3g}  err {_pct(cal.scls_errors[0])}")
        print(f"  SCLS eq. 4   d1={s.d1:.3g} d2={s.d2:.3g} d3={s.d3:.3g} d4={s.d4:.3g}  err {_pct(cal.scls_errors[1])}")
        print(f"  SCLS memory  Δ={p.scls.kv_bytes_per_token:.0f} B/token, M_ava={p.scls.kv_pool_bytes / 2**30:.2f} GiB")
    for label, r in (("prefill", cal.prefill), ("decode", cal.decode)):
        print(
            f"  {label:<8} err train {_pct(r.train_error)} ({r.n_train}), "
            f"held-out {_pct(r.test_error)} ({r.n_test}), measurement noise {_pct(r.noise)}"
        )
    print(f"  wrote        {out}\n               {png}\n               {md}")
