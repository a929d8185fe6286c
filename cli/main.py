"""The `tetriserve` command: serve | frontdoor | stop | generate | status | top | policy | flip | scale | profile |
model tiny | predictor."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from tetriserve.cli.admin import add_policy_parser, run_policy, run_status
from tetriserve.cli.elastic import add_elastic_parsers, run_flip, run_scale
from tetriserve.cli.predictor import add_predictor_parser, run_predictor
from tetriserve.cli.profile import add_profile_parser, run_profile
from tetriserve.cli.security import (
    add_client_flags,
    add_serve_security_flags,
    connect,
    serve_security_overrides,
)
from tetriserve.cli.top import add_top_parser, run_top
from tetriserve.cli.tracing import add_tracing_flags, tracing_overrides
from tetriserve.common import log_context

# flag -> dotted ClusterConfig field
_SERVE_FLAGS: dict[str, tuple[str, type, str]] = {
    "--model": ("engine.model", str, "Hugging Face model directory (default: the tiny random-weight model)"),
    "--served-model-name": ("engine.served_model_name", str, "name clients pass as `model`"),
    "--dtype": ("engine.dtype", str, "auto | float32 | bfloat16 | float16"),
    "--max-model-len": ("engine.max_model_len", int, "context length, tokens (prompt + output)"),
    "--block-size": ("engine.block_size", int, "KV block size in tokens (CPU: multiple of 32)"),
    "--kv-cache-gb": ("engine.kv_cache_gb", float, "KV cache per CPU engine, GiB"),
    "--threads-per-engine": ("engine.threads_per_engine", int, "OMP threads per engine"),
    "--decode-niceness": ("engine.decode_niceness", int, "niceness of decode engine threads (0-19; 0: equal share)"),
    "--share-decode-cores": (
        "engine.share_decode_cores",
        str,
        "none | rest | all: who may run on a reserved decode core between its engine's steps",
    ),
    "--prefill-niceness": (
        "engine.prefill_niceness",
        int,
        "niceness of prefill engine threads (-20-19; below 0 needs CAP_SYS_NICE)",
    ),
    "--borrow-min-batch": (
        "engine.borrow_min_batch",
        int,
        "CPU: a decode engine borrows idle cores only for steps of at least this many running requests",
    ),
    "--borrow-min-idle": (
        "engine.borrow_min_idle_cores",
        float,
        "CPU: a decode engine borrows idle cores only while the rest of the machine leaves at least this many "
        "idle (default 0.5)",
    ),
    "--stream-interval-ms": (
        "engine.stream_interval_ms",
        float,
        "hand tokens to the worker at most this often (0: every step)",
    ),
    "--num-prefill": ("num_prefill", int, "prefill workers"),
    "--num-decode": ("num_decode", int, "decode workers"),
    "--chunk-size": ("prefill.chunk_size", int, "ChunkSize: prefill tokens per iteration"),
    "--prefill-sched-batch": (
        "prefill.sched_batch",
        int,
        "PrefillSchedBatch: arrivals the prefill queue policy orders together (TetriInfer §3.3.1)",
    ),
    "--offload-max-tokens": (
        "prefill.offload_max_tokens",
        int,
        "prompts of at most this many tokens are computed by a decode worker with room (0: off)",
    ),
    "--prefill-policy": ("prefill.queue_policy", str, "prefill queue order: fcfs | sjf | ljf | accelgen | sola"),
    "--chunking": ("prefill.chunking", str, "fixed | none | dynamic (AccelGen S_b = S_pf·SLO_min/T̄_pf)"),
    "--chunk-selection": ("prefill.chunk_selection", str, "dynamic chunking: in-order | multi-resource"),
    "--max-batch-tokens": ("prefill.max_batch_tokens", int, "prefill engine's ceiling on tokens per iteration"),
    "--cost-profile": ("prefill.cost_profile", str, "cost profile JSON (default: this model's, from `profile`)"),
    "--admission-policy": (
        "decode.admission_policy",
        str,
        "greedy | reserve-static | reserve-dynamic | cacheopt | sola",
    ),
    "--preemption-order": ("decode.preemption_order", str, "decode victim order: vllm | srtf | lkvo | cacheopt"),
    "--preemption-mode": ("decode.preemption_mode", str, "recompute | swap | auto (sweet spot from the profile)"),
    "--preemption-profile": ("decode.preemption_profile", str, "swap/recompute latency profile JSON (for auto)"),
    "--slice-iters": ("decode.slice_iters", int, "SCLS slice length S; requests may move at slice ends (0: off)"),
    "--slice-min-interval": ("slice_min_interval_s", float, "SCLS eq. 12 Γ: least seconds between rebalancings"),
    "--dispatch-policy": (
        "prefill.dispatch_policy",
        str,
        "power-of-two | random | round-robin | least-loaded | imbalance | max-min",
    ),
    "--predictor": ("prefill.predictor", str, "output-length predictor: auto | trained | baseline | oracle"),
    "--predictor-artifact": ("prefill.predictor_artifact", str, "trained heads' JSON (default: the committed g200)"),
    "--predictor-dtype": ("prefill.predictor_dtype", str, "trained predictor's encoder: auto | float32 | bfloat16"),
    "--predictor-workload": ("prefill.predictor_workload", str, "oracle predictor's JSONL of true lengths"),
    "--host": ("host", str, "address the front doors bind to"),
    "--grpc-port": ("grpc_port", int, "gRPC port"),
    "--http-port": ("http_port", int, "OpenAI-compatible HTTP port"),
    "--address": ("ray_address", str, "Ray cluster to join (default: start a local one)"),
    "--migration-limit": ("migration_limit", int, "re-placements/migrations per request after worker failures"),
    "--transport": ("transport.backend", str, "KV transfer backend: auto|tcp|shm|ucx|nccl|mock (timing only)"),
    "--emulate-gbps": ("transport.emulate.gbps", float, "shape KV sends to a link of this many Gb/s"),
    "--emulate-latency-us": (
        "transport.emulate.latency_us",
        float,
        "one-way latency added to every KV send on the emulated link, µs (with --emulate-gbps)",
    ),
    "--kv-lease": ("transport.lease_s", float, "seconds parked KV (sent or landed, not taken) is kept (default 300)"),
    "--kv-sync-load-mib": (
        "transport.sync_load_mib",
        float,
        "landed KV of at most this many MiB is copied within the decode engine's step (default 4)",
    ),
    "--kv-load-failure-policy": ("kv_load_failure_policy", str, "recompute | fail: a decode engine's lost KV transfer"),
    "--flip-policy": ("flip.policy", str, "off | tetriinfer | slo: workers change role by themselves"),
    "--flip-interval": ("flip.interval_s", float, "tetriinfer: seconds a worker stays idle before it flips"),
    "--flip-threshold": ("flip.load_threshold", float, "tetriinfer and slo: load under which a worker is idle (0-1)"),
    "--ttft-slo-ms": ("flip.ttft_slo_ms", float, "slo: TTFT objective of requests without their own"),
    "--tpot-slo-ms": ("flip.tpot_slo_ms", float, "slo: TPOT objective of requests without their own"),
    "--max-workers": ("scale.max_workers", int, "slo: add workers up to this many in all (0: only flip)"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tetriserve", description="Disaggregated prefill/decode LLM serving on vLLM.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="start the cluster and its gRPC + OpenAI HTTP front doors")
    s.add_argument("--config", help="cluster config YAML (flags override it)")
    for flag, (_, typ, text) in _SERVE_FLAGS.items():
        s.add_argument(flag, type=typ, default=None, help=text)
    s.add_argument(
        "--borrow-idle-cores",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CPU: decode engines step with the cores idle prefill engines leave, at large batches (default: on)",
    )
    s.add_argument(
        "--reserve-decode-cores",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CPU, a Ray cluster of its own: decode engines get cores of their own, the rest of the service "
        "the others (default: on)",
    )
    s.add_argument(
        "--kv-pipeline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send each prefill chunk's KV as it is computed once the decode worker is chosen (default: on)",
    )
    s.add_argument(
        "--kv-pull",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shm within a host: decode workers pull published KV from the prefill's slabs (default: on)",
    )
    s.add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="skip torch.compile / CUDA graphs (faster start, slower steps)",
    )
    add_serve_security_flags(s)
    add_tracing_flags(s)

    fd = sub.add_parser("frontdoor", help="one more pair of front doors (gRPC + HTTP) for a running service")
    fd.add_argument("--address", default="auto", help="the service's Ray cluster (default: the one on this host)")
    fd.add_argument("--namespace", default="tetriserve", help="the service's Ray namespace (its config's `namespace`)")
    fd.add_argument("--host", default="127.0.0.1", help="address this front door binds to")
    fd.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: any free one)")
    fd.add_argument("--http-port", type=int, default=8000, help="OpenAI-compatible HTTP port (0: any free one)")
    fd.add_argument("--model", default=None, help="model directory here, for the tokenizer (default: the service's)")
    add_serve_security_flags(fd)  # given, they replace the service's security settings for this front door

    sp = sub.add_parser("stop", help="stop a running service: its workers and control plane (all front doors)")
    sp.add_argument("--address", default="auto", help="the service's Ray cluster (default: the one on this host)")
    sp.add_argument("--namespace", default="tetriserve", help="the service's Ray namespace")

    g = sub.add_parser("generate", help="stream a completion from a running service (gRPC)")
    g.add_argument("prompt")
    g.add_argument("--target", default="localhost:50051", help="gRPC address")
    g.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    g.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    add_client_flags(g)

    st = sub.add_parser("status", help="workers, roles and loads of a running service")
    st.add_argument("--target", default="localhost:50051", help="gRPC address")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    add_client_flags(st)

    add_elastic_parsers(sub)

    m = sub.add_parser("model", help="build models")
    msub = m.add_subparsers(dest="model_command", required=True)
    t = msub.add_parser("tiny", help="write the tiny random-weight Llama + ShareGPT BPE tokenizer")
    t.add_argument("--out", default=None, help="output directory (default: $TETRISERVE_HOME/models/tiny-llama)")
    t.add_argument("--force", action="store_true", help="rebuild even if present")

    add_predictor_parser(sub)
    add_profile_parser(sub)
    add_policy_parser(sub)
    add_top_parser(sub)
    return p


def _serve(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import serve
    from tetriserve.common.config import ClusterConfig

    overrides = {dotted: getattr(args, flag[2:].replace("-", "_")) for flag, (dotted, _, _) in _SERVE_FLAGS.items()}
    overrides["engine.enforce_eager"] = args.enforce_eager
    overrides["engine.borrow_idle_cores"] = args.borrow_idle_cores
    overrides["engine.reserve_decode_cores"] = args.reserve_decode_cores
    overrides["transport.pipeline"] = args.kv_pipeline
    overrides["transport.pull"] = args.kv_pull
    overrides.update(serve_security_overrides(args))
    overrides.update(tracing_overrides(args))
    serve(ClusterConfig.load(args.config, overrides))
    return 0


def _frontdoor(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import frontdoor
    from tetriserve.common.config import ClusterConfig

    own = {"ray_address": args.address, "host": args.host, "grpc_port": args.grpc_port, "http_port": args.http_port}
    security = {k: v for k, v in serve_security_overrides(args).items() if v is not None}
    config = ClusterConfig.load(overrides={**own, **security})
    frontdoor(config, args.namespace, args.model, own_security=bool(security))
    return 0


def _stop(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import stop_service

    stop_service(args.address, args.namespace)
    return 0


def _generate(args: argparse.Namespace) -> int:
    with connect(args) as client:
        options: dict[str, Any] = {
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "ignore_eos": args.ignore_eos,
            "timeout": args.timeout,
        }
        if args.seed is not None:
            options["seed"] = args.seed
        stream = client.generate(args.prompt, **options)
        last: Any = None
        for chunk in stream:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
    if last is not None:
        usage = (
            f", {last.usage.prompt_tokens} prompt + {last.usage.completion_tokens} completion tokens"
            if last.usage
            else ""
        )
        print(f"\n[finish: {last.finish_reason}{usage}]", file=sys.stderr)
    return 0


def _model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    out = Path(args.out) if args.out else default_tiny_model_dir()
    print(build_tiny_model(out, force=args.force))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    log_context.install()  # log lines of a request show its id (and trace id): FORMAT's request_tag
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=log_context.FORMAT)
    handlers = {
        "serve": _serve,
        "frontdoor": _frontdoor,
        "stop": _stop,
        "generate": _generate,
        "status": run_status,
        "model": _model,
        "predictor": run_predictor,
        "profile": run_profile,
        "policy": run_policy,
        "flip": run_flip,
        "scale": run_scale,
        "top": run_top,
    }
    from tetriserve.client.errors import TetriServeError, Unavailable

    try:
        return handlers[args.command](args)
    except Unavailable as exc:
        target = getattr(args, "target", "")
        print(f"tetriserve: no service at {target} ({exc}); is `tetriserve serve` running?", file=sys.stderr)
        return 1
    except TetriServeError as exc:
        print(f"tetriserve: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        print(f"tetriserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
