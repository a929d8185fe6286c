"""Decode admission and preemption side by side on one real decode engine (TetriInfer Fig. 18, CacheOpt Fig. 7-8).

    python benchmarks/decode_policies.py      # ~35 min on 2 cores; writes results/decode_policies{.md,.json}

1. Fig. 18: mean JCT of greedy (vLLM's), reserve-static and reserve-dynamic admission, with the trained
   predictor's estimates and with the oracle's, on one burst of ShareGPT requests.
2. Fig. 8 / §3.5: recompute and swap latency against context length, profiled on this engine (recompute:
   prefilling S tokens, less a 1-token step's fixed cost; swap: packing S tokens' blocks out of the KV
   cache into the connector's host buffer and back), the fitted curves and their sweet spot, saved as
   results/decode_policies_preemption_profile.json (``<out>_preemption_profile.json``), the profile
   ``decode.preemption.mode=auto`` reads (``decode.preemption.profile``).
3. Fig. 7: number of preemptions and tail preemption time (preempted → decoding again) under greedy
   admission for vLLM's victim order, SRTF, LKVO and CacheOpt's, each preempting by recompute; then
   CacheOpt's order with swap, and CacheOpt's admission with its order and the sweet-spot choice.

Every run uses the same requests on the same warm engine (``decode_harness.py``); the KV cache is small
enough (``--blocks``) that greedy admission must preempt. Prints a line per run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_harness import (
    BLOCK,
    RESULTS,
    BurstResult,
    Job,
    bench_header,
    header_lines,
    load_jobs,
    make_engine,
    median,
    run_burst,
    scheduler,
    workload_args,
    write_results,
)
from tetriserve.decode_worker.preemption.stats import tail

TBT_CLASSES_S = (0.1, 0.3, 1.0)  # CacheOpt's TBT SLO buckets need SLOs: each job gets one of these at random


def with_slos(jobs: list[Job], seed: int) -> list[Job]:
    rng = random.Random(seed)
    return [replace(j, tbt_slo_s=rng.choice(TBT_CLASSES_S)) for j in jobs]


def configure(engine: Any, admission: str, order: str = "vllm", mode: str = "recompute", costs: Any = None) -> None:
    from tetriserve.decode_worker.admission import make_admission_policy
    from tetriserve.decode_worker.preemption import PreemptionStrategy, make_preemption_order

    scheduler(engine).configure(
        make_admission_policy(admission), make_preemption_order(order), PreemptionStrategy(mode, costs)
    )


@dataclass(frozen=True)
class Config:
    name: str
    admission: str
    order: str = "vllm"
    mode: str = "recompute"
    estimates: str = "trained"


GREEDY = Config("greedy", "greedy")  # ignores the estimates; also Fig. 7's "vllm order, recompute" row
FIG18 = (
    GREEDY,
    Config("reserve-static", "reserve-static"),
    Config("reserve-dynamic", "reserve-dynamic"),
    Config("reserve-static", "reserve-static", estimates="oracle"),
    Config("reserve-dynamic", "reserve-dynamic", estimates="oracle"),
)
FIG7 = (
    Config("srtf order, recompute", "greedy", "srtf"),
    Config("lkvo order, recompute", "greedy", "lkvo"),
    Config("cacheopt order, recompute", "greedy", "cacheopt"),
    Config("cacheopt order, swap", "greedy", "cacheopt", "swap"),
    Config("cacheopt admission + order + sweet spot", "cacheopt", "cacheopt", "auto"),
)


def measure(engine: Any, jobs: list[Job], max_out: int, costs: Any, rounds: int) -> dict[Config, dict[str, Any]]:
    """Every config ``rounds`` times, their order rotated each round (this VM's speed drifts by tens of
    percent from minute to minute); per config the median over rounds of each timing, and every round's
    mean JCT. Preemption counts are the same every round (greedy sampling, same requests)."""
    configs = (*FIG18, *FIG7)
    runs: dict[Config, list[BurstResult]] = {c: [] for c in configs}
    for r in range(rounds):
        k = r * len(configs) // max(1, rounds)
        for c in configs[k:] + configs[:k]:
            configure(engine, c.admission, c.order, c.mode, costs)
            res = run_burst(engine, jobs, c.estimates, f"r{r}-{c.admission}-{c.order}-{c.mode}-{c.estimates}", max_out)
            runs[c].append(res)
            print(
                f"  round {r} {c.name:40s} {c.estimates:8s} mean JCT {statistics.mean(res.jct_s):.2f} s, "
                f"{res.preemptions} preemptions",
                flush=True,
            )
    out = {}
    for c, rs in runs.items():
        out[c] = {
            "run": c.name,
            "estimates": c.estimates if c.admission != "greedy" else "(ignored)",
            "mean_jct_s": median([statistics.mean(x.jct_s) for x in rs]),
            "median_jct_s": median([median(x.jct_s) for x in rs]),
            "wall_s": median([x.wall_s for x in rs]),
            "preemptions": "/".join(sorted({str(x.preemptions) for x in rs})),
            "swapped": "/".join(sorted({str(x.swapped) for x in rs})),
            "preemption_median_ms": median([median(x.preemption_s) for x in rs]) * 1e3,
            "preemption_p99_ms": median([tail(x.preemption_s) for x in rs]) * 1e3,
            "rounds_mean_jct_s": ", ".join(f"{statistics.mean(x.jct_s):.1f}" for x in rs),
        }
    return out


def profile_preemption(engine: Any, lengths: list[int], reps: int) -> dict[str, Any]:
    """Recompute = prefilling S tokens, less a 1-token step (the step's fixed cost, which a preempted request
    recomputed inside a batched step does not add); swap = pack S tokens' blocks into the connector's host
    buffer, then load them back into the blocks."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from tetriserve.decode_worker.preemption.strategy import PreemptionCosts, fit_recompute, fit_swap, sweet_spot
    from tetriserve.engine.hardware import detect_hardware
    from tetriserve.transport import kv_codec

    connector: Any = get_kv_transfer_group()
    rng = random.Random(7)
    rec: dict[int, list[float]] = {s: [] for s in lengths}
    swp: dict[int, list[float]] = {s: [] for s in lengths}

    def prefill_s(tag: str, n: int) -> float:
        prompt = [rng.randrange(10, 4000) for _ in range(n)]
        engine.add_request(tag, {"prompt_token_ids": prompt}, SamplingParams(max_tokens=1))
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        return time.perf_counter() - t0

    for rep in range(reps):
        for s in lengths:
            floor = prefill_s(f"prof-{rep}-{s}-floor", 1)  # the step's fixed cost, paid anyway in a batched step
            rec[s].append(max(1e-5, prefill_s(f"prof-{rep}-{s}", s) - floor))
            blocks = list(range(kv_codec.blocks_for(s, BLOCK)))
            t0 = time.perf_counter()
            packed = kv_codec.pack(connector._layers, connector._dim, blocks, s, BLOCK)
            connector._transport.hold(f"prof-{rep}-{s}", packed.buffers)
            buffers = connector._transport.recv(f"prof-{rep}-{s}")
            kv_codec.unpack_into(connector._layers, connector._dim, blocks, buffers)
            swp[s].append(time.perf_counter() - t0)
    rec_med = [median(rec[s]) for s in lengths]
    swp_med = [median(swp[s]) for s in lengths]
    r_fit, s_fit = fit_recompute(lengths, rec_med), fit_swap(lengths, swp_med)
    costs = PreemptionCosts(r_fit, s_fit, sweet_spot(r_fit, s_fit, 1 << 20), detect_hardware())
    return {"lengths": lengths, "recompute_s": rec_med, "swap_s": swp_med, "costs": costs}


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    def table(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            cells = [f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
            out.append("| " + " | ".join(cells) + " |")
        return out

    f18 = res["fig18"]
    rounds = res["rounds"]
    lines = [
        "# Decode admission and preemption on one real decode engine",
        "",
        *header_lines(res),
        "Tiny model (float32, 1 thread), "
        f"{args.requests} ShareGPT test-split requests in one burst (prompt ≤ {args.max_prompt} tokens, "
        f"true output ≤ {args.max_out} tokens, mean {res['mean_output']:.0f}), KV cache {args.blocks} blocks × "
        f"{BLOCK} tokens. Same requests, same warm engine for every run; {rounds} rounds, configurations "
        "rotated; timings are medians over rounds (every round's mean JCT in the last column).",
        "",
        "## TetriInfer Fig. 18: decode admission, mean JCT",
        "",
        *table(f18, ["estimates", "run", "mean_jct_s", "median_jct_s", "preemptions", "wall_s", "rounds_mean_jct_s"]),
        "",
    ]
    base = next(r for r in f18 if r["run"] == "greedy")["mean_jct_s"]
    for source in ("trained", "oracle"):
        for pol in ("reserve-static", "reserve-dynamic"):
            v = next(r for r in f18 if r["estimates"] == source and r["run"] == pol)["mean_jct_s"]
            lines.append(f"- {source} estimates: {pol} mean JCT {v / base - 1:+.1%} vs greedy")
    prof = res["profile"]
    lines += [
        "",
        "## CacheOpt Fig. 8 / §3.5: recompute vs swap latency (profiled on this engine)",
        "",
        "| context tokens | recompute ms (over a 1-token step) | swap out+in ms |",
        "|---|---|---|",
        *[
            f"| {s} | {r * 1e3:.2f} | {w * 1e3:.2f} |"
            for s, r, w in zip(prof["lengths"], prof["recompute_s"], prof["swap_s"], strict=True)
        ],
        "",
        f"Fitted: L_r(S) = {prof['costs']['recompute']['alpha']:.3g}·S^{prof['costs']['recompute']['beta']:.2f} + "
        f"{prof['costs']['recompute']['kappa']:.3g}·S + {prof['costs']['recompute']['eps']:.3g}; "
        f"L_s(S) = {prof['costs']['swap']['gamma']:.3g}·S + {prof['costs']['swap']['delta']:.3g}. "
        f"Sweet spot: {prof['costs']['sweet_spot']} tokens (saved to `{res['profile_path']}`).",
        "",
        "## CacheOpt Fig. 7: preemption order, greedy admission (trained estimates)",
        "",
        *table(
            res["fig7"],
            [
                "run",
                "preemptions",
                "swapped",
                "preemption_median_ms",
                "preemption_p99_ms",
                "mean_jct_s",
                "rounds_mean_jct_s",
            ],
        ),
        "",
        "Preemption time: from a request's preemption until it is decoding again (waiting + recompute or swap-in). "
        f"The first row is Fig. 18's greedy run. `auto` swaps victims with at least "
        f"{prof['costs']['sweet_spot']} tokens of context (the sweet spot above) and recomputes the rest.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--profile-reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    workload_args(ap, blocks=64)
    ap.add_argument("--out", default=str(RESULTS / "decode_policies"))
    args = ap.parse_args()

    model_path, facts = bench_header()
    jobs = with_slos(load_jobs(args.requests, args.seed, model_path, args.max_prompt, args.max_out), args.seed)
    engine = make_engine(model_path, args.blocks, connector="bench-decode-policies")
    print(f"{len(jobs)} jobs, mean output {statistics.mean(j.truth for j in jobs):.0f} tokens", flush=True)
    res: dict[str, Any] = {**facts, "mean_output": statistics.mean(j.truth for j in jobs)}
    longest = engine.vllm_config.model_config.max_model_len - 1
    lengths = sorted({min(s, longest) for s in (32, 64, 128, 256, 512, 768, 1000)})
    prof = profile_preemption(engine, lengths, args.profile_reps)
    profile_path = Path(args.out).with_name(Path(args.out).name + "_preemption_profile.json")
    prof["costs"].save(profile_path)
    res["profile_path"] = profile_path.name
    rows = measure(engine, jobs, args.max_out, prof["costs"], args.rounds)
    res["rounds"] = args.rounds
    res["fig18"] = [rows[c] for c in FIG18]
    res["fig7"] = [{**rows[GREEDY], "run": "vllm order, recompute"}, *(rows[c] for c in FIG7)]
    res["profile"] = {**prof, "costs": asdict(prof["costs"])}
    write_results(Path(args.out), res, report(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
