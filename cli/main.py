"""The `tetriserve` command: serve | frontdoor | stop | generate | status | top | policy | flip | scale | profile |
model tiny | predictor."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from tetriserve.cli.admin import add_policy_parser, run_policy, run_status
from tetriserve.cli.config_flags import LIST_PRESETS, SECURITY_FLAGS, add_config_flags, config_overrides
from tetriserve.cli.elastic import add_elastic_parsers, run_flip, run_scale
from tetriserve.cli.predictor import add_predictor_parser, run_predictor
from tetriserve.cli.profile import add_profile_parser, run_profile
from tetriserve.cli.security import add_client_flags, connect
from tetriserve.cli.top import add_top_parser, run_top
from tetriserve.common import log_context

if TYPE_CHECKING:
    from tetriserve.client.options import GenerateOptions
    from tetriserve.client.results import Chunk


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tetriserve", description="Disaggregated prefill/decode LLM serving on vLLM.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="start the cluster and its gRPC + OpenAI HTTP front doors")
    s.add_argument("--config", help="cluster config YAML (flags override it)")
    add_config_flags(s)

    fd = sub.add_parser("frontdoor", help="one more pair of front doors (gRPC + HTTP) for a running service")
    fd.add_argument("--address", default="auto", help="the service's Ray cluster (default: the one on this host)")
    fd.add_argument("--namespace", default="tetriserve", help="the service's Ray namespace (its config's `namespace`)")
    fd.add_argument("--host", default="127.0.0.1", help="address this front door binds to")
    fd.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: any free one)")
    fd.add_argument("--http-port", type=int, default=8000, help="OpenAI-compatible HTTP port (0: any free one)")
    fd.add_argument("--model", default=None, help="model directory here, for the tokenizer (default: the service's)")
    # given, they override the service's security settings of the same names for this front door
    add_config_flags(fd, SECURITY_FLAGS, set_any=False)

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

    if args.cfg_preset is LIST_PRESETS:
        from tetriserve.common.presets import preset_listing

        print(preset_listing())
        return 0
    overrides = config_overrides(args)
    serve(ClusterConfig.load(args.config, overrides))
    return 0


def _frontdoor(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import frontdoor
    from tetriserve.common.config import ClusterConfig

    own = {"ray_address": args.address, "host": args.host, "grpc_port": args.grpc_port, "http_port": args.http_port}
    security = config_overrides(args, SECURITY_FLAGS)
    config = ClusterConfig.load(overrides={**own, **security})  # checks the flags' values before joining
    changes = {dotted.removeprefix("security."): value for dotted, value in security.items()}
    frontdoor(config, args.namespace, args.model, security_changes=changes)
    return 0


def _stop(args: argparse.Namespace) -> int:
    from tetriserve.cli.serve import stop_service

    stop_service(args.address, args.namespace)
    return 0


def _generate(args: argparse.Namespace) -> int:
    with connect(args) as client:
        options: GenerateOptions = {
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "ignore_eos": args.ignore_eos,
            "timeout": args.timeout,
        }
        if args.seed is not None:
            options["seed"] = args.seed
        stream = client.generate(args.prompt, **options)
        last: Chunk | None = None
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
