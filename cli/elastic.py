"""`tetriserve flip` and `tetriserve scale`: change a running service's roles and worker counts, over gRPC.

    tetriserve flip WORKER ROLE          [--target HOST:PORT] [--no-wait] [--timeout S]
        e.g. `tetriserve flip decode-1 prefill`: decode-1 is drained (no new requests; what it holds
        finishes), then serves prefill. Waits, showing progress, until it serves in its new role.
    tetriserve scale [--prefill N] [--decode M] [--target HOST:PORT] [--no-wait] [--timeout S]
        adds workers (new Ray actors, each asking for the CPUs/GPUs its engine uses) or drains and removes
        them until each given role has that many. Waits until the counts are reached.

Refusals come back in gRPC's shape (NOT_FOUND: no such worker; FAILED_PRECONDITION: cannot be done now,
with the reason): exit code 1. A wait that runs out: exit code 1, the service goes on with the order.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tetriserve.cli.security import add_client_flags, connect

if TYPE_CHECKING:
    from tetriserve.client import TetriServeClient
    from tetriserve.client.results import ClusterStatus

DEFAULT_TARGET = "localhost:50051"
POLL_S = 1.0


def add_elastic_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = sub.add_parser("flip", help="flip a worker to the other role (drained first), e.g. `flip decode-1 prefill`")
    f.add_argument("worker", help="the worker's id, e.g. decode-1")
    f.add_argument("role", choices=("prefill", "decode"), help="its new role")
    s = sub.add_parser("scale", help="add or remove workers, e.g. `scale --prefill 2 --decode 2`")
    s.add_argument("--prefill", type=int, default=None, help="prefill workers wanted (default: as now)")
    s.add_argument("--decode", type=int, default=None, help="decode workers wanted (default: as now)")
    for cmd in (f, s):
        cmd.add_argument("--target", default=DEFAULT_TARGET, help="gRPC address")
        cmd.add_argument("--no-wait", action="store_true", help="return once the order is started")
        cmd.add_argument("--timeout", type=float, default=600.0, help="longest wait, seconds")
        add_client_flags(cmd)


def run_flip(args: argparse.Namespace) -> int:
    with connect(args) as client:
        flips_before = _flips(client, args.worker)
        print(client.flip(args.worker, args.role, timeout=30), flush=True)
        if args.no_wait:
            return 0

        def done(st: ClusterStatus) -> bool:
            w = next((w for w in st.workers if w.worker_id == args.worker), None)
            return w is not None and w.role == args.role and w.lifecycle == "active" and w.flips > flips_before

        if not _wait(client, done, args.timeout):
            return 1
        w = next(w for w in client.cluster_status(timeout=10).workers if w.worker_id == args.worker)
        print(f"{args.worker} serves {args.role} now (flip {w.flips})", flush=True)
    return 0


def run_scale(args: argparse.Namespace) -> int:
    if args.prefill is None and args.decode is None:
        raise ValueError("give --prefill N and/or --decode M")
    wanted = {r: n for r, n in (("prefill", args.prefill), ("decode", args.decode)) if n is not None}
    with connect(args) as client:
        for line in client.scale(args.prefill, args.decode, timeout=30):
            print(line, flush=True)
        if args.no_wait:
            return 0

        def done(st: ClusterStatus) -> bool:
            counts = _serving_counts(st)
            settled = all(w.lifecycle in ("active", "") for w in st.workers)
            return settled and all(counts.get(r, 0) == n for r, n in wanted.items())

        if not _wait(client, done, args.timeout):
            return 1
        counts = _serving_counts(client.cluster_status(timeout=10))
        print("serving: " + ", ".join(f"{counts.get(r, 0)} {r}" for r in ("prefill", "decode")), flush=True)
    return 0


def _flips(client: TetriServeClient, worker: str) -> int:
    for w in client.cluster_status(timeout=10).workers:
        if w.worker_id == worker:
            return int(w.flips)
    return 0


def _serving_counts(st: ClusterStatus) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in st.workers:
        if w.lifecycle in ("active", "") and w.health == "serving":
            counts[w.role] = counts.get(w.role, 0) + 1
    return counts


def _wait(client: TetriServeClient, done: Callable[[ClusterStatus], bool], timeout_s: float) -> bool:
    """Poll ``cluster_status`` until ``done``, printing each worker whose state changed; False on timeout."""
    deadline = time.monotonic() + timeout_s
    shown: dict[str, str] = {}
    while True:
        st = client.cluster_status(timeout=10)
        for w in st.workers:
            line = f"{w.role} {w.lifecycle or w.state}/{w.health or '-'}"
            if shown.get(w.worker_id) != line:
                shown[w.worker_id] = line
                print(f"  {w.worker_id}: {line}", flush=True)
        if done(st):
            return True
        if time.monotonic() >= deadline:
            print(f"tetriserve: still under way after {timeout_s:g} s (see `tetriserve status`)", file=sys.stderr)
            return False
        time.sleep(POLL_S)
