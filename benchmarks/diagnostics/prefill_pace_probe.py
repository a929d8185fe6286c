"""The prefill pace a served worker reports before a burst, against what the burst then took.

    python benchmarks/diagnostics/prefill_pace_probe.py --rounds 2
    python benchmarks/diagnostics/prefill_pace_probe.py --warmup smoke --num-prompts 60 --commit COMMIT

Each round starts a fresh ``tetriserve serve`` (default config), warmed up as ``vllm_bench_serve.py`` warms it
(its 64 prompts at once; ``--warmup smoke``: as a user's first look at a fresh service, two single prompts, the
benchmark client's test prompt and one more; ``--commit C``: the server runs commit ``C``'s code, not the
working tree's), and then sends its saturation scenario (``--num-prompts`` ShareGPT prompts at once,
vLLM's benchmark client, ``--ignore-eos``). Just before the burst it reads the front door's ``/metrics``: the
prefill worker's reported pace (``prefill_seconds_per_token``: ``prefill_worker/pace.py``) and, for comparison,
the warm-up's seconds of prefill steps over its prompt tokens (from the step and prompt-token counters). During
the burst it samples the reported queue wait (``prefill_queue_wait_seconds``) every 0.25 s. The GlobalScheduler
prices the prompts it places before the worker's next report at the pace before the burst and refuses where a
worker's queue would exceed ``admission.max_wait_s`` (30 s): the report sets the whole burst's prompt tokens at
either pace beside the burst's largest TTFT (every prompt's wait, the last one's included) and the requests
refused. Writes ``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from engine_steps import worker_series
from vllm_bench_report import RESULTS, checkout_env, code_state, report_head, saved
from vllm_bench_serve import TETRISERVE_PORT, prepare, run_bench, warmed_server

READ = (
    "engine_step_seconds",
    "engine_prompt_tokens",
    "kv_handoffs",
    "prefill_queue_wait_seconds",
    "prefill_seconds_per_token",
)


def series(role: str) -> dict[str, float]:
    """The series ``READ`` of the workers in ``role`` on ``/metrics``, summed over workers, by name (and clock,
    source or mode)."""
    out: dict[str, float] = {}
    for (name, _, kind), value in worker_series(role, READ).items():
        key = f"{name}:{kind}" if kind else name
        out[key] = out.get(key, 0.0) + value
    return out


def sample_waits(stop: threading.Event, waits: list[float]) -> None:
    while not stop.wait(0.25):
        with contextlib.suppress(OSError):
            waits.append(series("prefill").get("prefill_queue_wait_seconds", 0.0))


STEP_S, COMPUTED, CACHED = "engine_step_seconds:wall", "engine_prompt_tokens:computed", "engine_prompt_tokens:cached"


def one_round(i: int, args: argparse.Namespace, model: str, dataset: Path, env: dict[str, str]) -> dict[str, float]:
    name = f"pace_r{i}"
    with warmed_server(name, "", args, model, dataset, env, args.warmup):
        before, decode_before = series("prefill"), series("decode")
        stop, waits = threading.Event(), []
        sampler = threading.Thread(target=sample_waits, args=(stop, waits), daemon=True)
        sampler.start()
        try:
            run_bench(name, "saturation", TETRISERVE_PORT, args, model, dataset)
        finally:
            stop.set()
            sampler.join()
        after, decode_after = series("prefill"), series("decode")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    result = saved(name, "saturation")
    ttfts = [t for t in result.get("ttfts", []) if t]
    burst = float(sum(result["input_lens"]))  # every request's, served or refused
    pace = before.get("prefill_seconds_per_token", 0.0)
    whole = delta.get(COMPUTED, 0.0) + delta.get(CACHED, 0.0)
    return {
        "pace_ms": 1e3 * pace,
        "burst_prompt_tokens": burst,
        "burst_priced_s": burst * pace,
        "largest_reported_wait_s": max(waits, default=0.0),
        "largest_ttft_s": max(ttfts, default=0.0),
        "median_ttft_s": statistics.median(ttfts) if ttfts else 0.0,
        "completed": float(result["completed"]),
        "refused": float(args.num_prompts - int(result["completed"])),
        "prefill_step_s": delta.get(STEP_S, 0.0),
        "prefill_computed_tokens": delta.get(COMPUTED, 0.0),
        "prefill_cached_tokens": delta.get(CACHED, 0.0),
        "burst_pace_ms": 1e3 * delta.get(STEP_S, 0.0) / max(whole, 1.0),
        "computed_pace_ms": 1e3 * delta.get(STEP_S, 0.0) / max(delta.get(COMPUTED, 0.0), 1.0),
        "offloaded": delta.get("kv_handoffs:offloaded", 0.0),
        "decode_computed_tokens": decode_after.get(COMPUTED, 0.0) - decode_before.get(COMPUTED, 0.0),
        "pace_after_ms": 1e3 * after.get("prefill_seconds_per_token", 0.0),
    }


COLUMNS = (
    ("pace_ms", "reported pace before the burst, ms/token", "{:.3f}"),
    ("burst_priced_s", "burst priced at it, s", "{:.1f}"),
    ("largest_reported_wait_s", "largest reported queue wait, s", "{:.1f}"),
    ("largest_ttft_s", "largest TTFT, s", "{:.1f}"),
    ("median_ttft_s", "median TTFT, s", "{:.1f}"),
    ("refused", "refused", "{:.0f}"),
    ("prefill_step_s", "prefill steps, s", "{:.1f}"),
    ("prefill_computed_tokens", "prompt tokens computed there", "{:.0f}"),
    ("prefill_cached_tokens", "held by its cache", "{:.0f}"),
    ("burst_pace_ms", "steps per prompt token there, ms", "{:.3f}"),
    ("computed_pace_ms", "per computed token, ms", "{:.3f}"),
    ("offloaded", "prompts offloaded", "{:.0f}"),
    ("decode_computed_tokens", "prompt tokens computed on decode", "{:.0f}"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", choices=("warmup", "smoke"), default="warmup")
    ap.add_argument("--commit", help="the server runs this commit's code instead of the working tree's")
    ap.add_argument("--out", default="prefill_pace_probe")
    args = ap.parse_args()
    args.ignore_eos = True
    model, dataset, env = prepare()
    if args.commit:
        env = checkout_env(args.commit, env)
    rounds = [one_round(i, args, model, dataset, env) for i in range(args.rounds)]
    code = f"server on commit {args.commit}" if args.commit else code_state()
    result = {"command": sys.argv[1:], "code": code, "rounds": rounds}
    lines = report_head(args.out, "The prefill pace before a burst, against the burst", "prefill_pace_probe.py", result)
    warmup = "the 64-prompt warm-up" if args.warmup == "warmup" else "two single prompts (a smoke test)"
    lines += [
        f"Burst: {args.num_prompts} ShareGPT prompts at once after {warmup}; the admission bound is 30 s.",
        "",
        "| round | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "| --- |" + " ---: |" * len(COLUMNS),
    ]
    for i, r in enumerate(rounds, 1):
        lines.append(f"| {i} | " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
