"""`tetriserve predictor train | eval | export | label`: the length predictor's offline workflow.

    train   [--granularity 200 ...] [--fast | --full] [--limit N] [--target-tokenizer DIR] [--pairs FILE]
    eval    [--granularity 100 200 400] [--from artifacts | runs] [--out benchmarks/results]
    export  [--granularity 100 200 400] [--out length_predictor/artifacts]
    label   --target HOST:PORT [--limit N] [--max-tokens 1024] --out FILE     (relabel via a running cluster)

The work itself is in ``length_predictor.commands``; this module only parses flags.
The target tokenizer defaults to the tiny model's (built on first use).
"""

from __future__ import annotations

import argparse
from pathlib import Path

GRANULARITIES = [100, 200, 400]


def add_predictor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pr = sub.add_parser("predictor", help="train, evaluate, export the output-length predictor")
    psub = pr.add_subparsers(dest="predictor_command", required=True)

    t = psub.add_parser("train", help="train the heads (fast: frozen encoder, cached embeddings)")
    t.add_argument("--granularity", type=int, nargs="+", default=[200], help="bucket widths (one artifact each)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--fast", dest="mode", action="store_const", const="fast", help="frozen encoder (CPU default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="fine-tune encoder (GPU default)")
    t.add_argument("--limit", type=int, default=None, help="use the first N pairs (default: all)")
    t.add_argument("--epochs", type=int, default=None, help="stage-1 epochs (default: 4)")
    t.add_argument("--max-steps", type=int, default=-1, help="full mode: stop after N steps (smoke tests)")
    t.add_argument("--pairs", default=None, help="a labelled pairs JSONL (from `predictor label`)")
    _common(t)

    e = psub.add_parser("eval", help="held-out report: markdown + PNG under benchmarks/results")
    e.add_argument("--granularity", type=int, nargs="+", default=GRANULARITIES, help="bucket widths to evaluate")
    e.add_argument(
        "--from",
        dest="source",
        choices=["artifacts", "runs"],
        default="artifacts",
        help="the committed heads or the last `train` output",
    )
    e.add_argument("--out", default="benchmarks/results", help="report directory")
    _common(e)

    x = psub.add_parser("export", help="copy trained heads into length_predictor/artifacts (committed)")
    x.add_argument("--granularity", type=int, nargs="+", default=GRANULARITIES, help="bucket widths to export")
    x.add_argument("--out", default=None, help="destination (default: length_predictor/artifacts)")

    lb = psub.add_parser("label", help="relabel pairs with a running cluster's real output lengths")
    lb.add_argument("--target", default="localhost:50051", help="gRPC address")
    lb.add_argument("--limit", type=int, default=None, help="first N pairs")
    lb.add_argument("--max-tokens", type=int, default=1024, help="most tokens each prompt may generate")
    lb.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
    lb.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    lb.add_argument("--out", required=True, help="output JSONL")
    _common(lb)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target-tokenizer", default=None, help="target model dir (default: the tiny model)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _tokenizer(args: argparse.Namespace) -> str:
    if args.target_tokenizer:
        return str(args.target_tokenizer)
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir

    return str(build_tiny_model(default_tiny_model_dir()))


def run_predictor(args: argparse.Namespace) -> int:
    from tetriserve.length_predictor import commands
    from tetriserve.length_predictor.paths import ARTIFACTS_DIR, artifact_stem, run_dir

    cmd = args.predictor_command
    if cmd == "export":
        for path in commands.export(args.granularity, args.out or ARTIFACTS_DIR):
            print(f"{path}  ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    progress = not args.no_progress
    if cmd == "train":
        import torch

        from tetriserve.length_predictor.train import TrainConfig

        mode = args.mode or ("full" if torch.cuda.is_available() else "fast")
        cfg = TrainConfig(progress=progress, **({"epochs": args.epochs} if args.epochs else {}))
        opts = commands.DataOptions(_tokenizer(args), args.limit, args.pairs)
        for path in commands.train(args.granularity, opts, cfg, mode, args.max_steps):
            print(path)
        return 0
    if cmd == "eval":
        base = ARTIFACTS_DIR if args.source == "artifacts" else None
        paths = [(base or run_dir(g)) / f"{artifact_stem(g)}.json" for g in args.granularity]
        print(commands.evaluate(paths, _tokenizer(args), Path(args.out), progress))
        return 0
    from tetriserve.length_predictor.labeling import LabelOptions, label_with_cluster

    pairs = commands.load_pairs(commands.DataOptions(_tokenizer(args), args.limit), progress)
    label_opts = LabelOptions(args.target, args.max_tokens, args.temperature, args.concurrency)
    print(label_with_cluster(pairs, args.out, label_opts, progress))
    return 0
