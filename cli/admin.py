"""`tetriserve status` and `tetriserve policy set|show`: a running service's workers and policies, over gRPC.

    tetriserve status      [--target HOST:PORT] [--json]              workers: role, state, flips, policy, load
    tetriserve policy show [--target HOST:PORT] [--worker ID] [--json] each worker's policies
    tetriserve policy set  [--target HOST:PORT] [--worker ID] [--json] KEY=VALUE ...
        e.g. `tetriserve policy set queue=sjf sched_batch=128 chunking=dynamic`: every prefill worker
        (or --worker ID) switches at once; prints the policies as they now are.
        `tetriserve policy set --worker decode admission.policy=cacheopt preemption.order=srtf`:
        every decode worker (or --worker decode-0) switches its admission and preemption policies.

--worker is a worker's id or a role: "prefill" / "decode" means every worker of that role.
Keys belong to one role, a key of the other role is rejected naming it (INVALID_ARGUMENT):
    prefill  queue chunking chunk_size selection sched_batch offload_max_tokens
    decode   admission.policy, its parameters admission.length_end admission.horizons
             admission.reserve_blocks admission.proactive_iters admission.buffer_tokens admission.basic_tokens
             admission.default_tbt_ms admission.zeta admission.cost_profile,
             preemption.order preemption.mode preemption.profile max_local_prompts slice_iters
             (the ``decode`` config section's keys below ``decode.``)

A malformed KEY=VALUE (or a key given twice) is a usage error: exit code 2
before any call. A key or value the service rejects comes back as
INVALID_ARGUMENT naming the key, an unknown worker as NOT_FOUND: exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence

from tetriserve.cli.security import add_client_flags, connect

DEFAULT_TARGET = "localhost:50051"
SET_KEYS_HELP = (
    "prefill: queue=fcfs|sjf|ljf|accelgen|sola  chunking=fixed|none|dynamic|sola  chunk_size=N  "
    "selection=in-order|multi-resource  sched_batch=N  offload_max_tokens=N  "
    "sola_tile_tokens=N (0: the profile's)  sola_window_iters=N (chunking=sola);  "
    "decode (--worker decode or decode-N): "
    "admission.policy=greedy|reserve-static|reserve-dynamic|cacheopt|sola|accelgen|scls  "
    "admission.length_end=lower|estimate|upper (reserve-*)  admission.horizons=all|shortest (reserve-dynamic)  "
    "admission.reserve_blocks=N  admission.proactive_iters=N  admission.buffer_tokens=N  admission.basic_tokens=N "
    "(cacheopt)  admission.default_tbt_ms=MS (accelgen)  admission.zeta=X  admission.cost_profile=PATH (scls)  "
    "preemption.order=vllm|srtf|lkvo|cacheopt|accelgen  preemption.mode=recompute|swap|auto  preemption.profile=PATH  "
    "max_local_prompts=N  slice_iters=N"
)
_PREFILL_ORDER = (
    "queue",
    "chunking",
    "chunk_size",
    "selection",
    "sched_batch",
    "offload_max_tokens",
    "sola_tile_tokens",
    "sola_window_iters",
    "dispatch",
    "predictor",
    "predictor_state",
)
_DECODE_ORDER = (
    "admission.policy",
    "admission.length_end",
    "admission.horizons",
    "admission.reserve_blocks",
    "admission.proactive_iters",
    "admission.buffer_tokens",
    "admission.basic_tokens",
    "admission.default_tbt_ms",
    "admission.zeta",
    "admission.cost_profile",
    "preemption.order",
    "preemption.mode",
    "preemption.profile",
    "max_local_prompts",
    "slice_iters",
    "preemptions",
    "swapped",
    "recomputed",
    "preemption_median_ms",
    "preemption_p99_ms",
    "admission_steps",
    "admission_mean_us",
    "slice_moved_out",
    "slice_moved_in",
    "slice_kept",
)
_KEY_ORDER = (*_PREFILL_ORDER, *_DECODE_ORDER)


def parse_assignment(text: str) -> tuple[str, str]:
    """One ``KEY=VALUE`` argument; argparse turns the error into exit code 2 with a usage message."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. queue=sjf), got {text!r}")
    return key, value


def changes_from(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The ``KEY=VALUE`` pairs as a dict; a key given twice raises ValueError (exit code 2)."""
    changes: dict[str, str] = {}
    for key, value in pairs:
        if key in changes:
            raise ValueError(f"{key}: given twice ({key}={changes[key]} and {key}={value})")
        changes[key] = value
    return changes


def format_policy(policy: Mapping[str, str]) -> str:
    """``queue=sjf chunking=fixed ...`` in a stable order (known keys first); ``-`` when empty."""
    keys = sorted(policy, key=lambda k: (_KEY_ORDER.index(k) if k in _KEY_ORDER else len(_KEY_ORDER), k))
    return " ".join(f"{k}={policy[k]}" for k in keys) or "-"


def add_policy_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `policy set` and `policy show` on the top-level subparsers."""
    p = sub.add_parser("policy", help="show or change workers' scheduling policies at run time (gRPC)")
    psub = p.add_subparsers(dest="policy_command", required=True)
    s = psub.add_parser("set", help="change policies, e.g. `policy set queue=sjf sched_batch=128`")
    s.add_argument("changes", nargs="+", type=parse_assignment, metavar="KEY=VALUE", help=SET_KEYS_HELP)
    sh = psub.add_parser("show", help="each worker's policies")
    for cmd in (s, sh):
        cmd.add_argument(
            "--worker",
            default=None,
            help="worker id, or prefill / decode for every worker of that role "
            "(default: set → every prefill worker, show → all)",
        )
        cmd.add_argument("--target", default=DEFAULT_TARGET, help="gRPC address")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
        cmd.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
        add_client_flags(cmd)


def run_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "set":
        changes = changes_from(args.changes)
        with connect(args) as client:
            update = client.set_policy(changes, args.worker, timeout=args.timeout)
        rows = [(w.worker_id, w.role, w.policy) for w in update.workers]
    else:
        with connect(args) as client:
            st = client.cluster_status(timeout=args.timeout)
        rows = [(w.worker_id, w.role, w.policy) for w in st.workers if args.worker in (None, w.worker_id, w.role)]
        if not rows:
            known = ", ".join(w.worker_id for w in st.workers)
            print(f"tetriserve: error: no worker {args.worker!r}; known: {known}", file=sys.stderr)
            return 1
    if args.json:
        workers = [{"worker_id": wid, "role": role, "policy": dict(policy)} for wid, role, policy in rows]
        print(json.dumps({"workers": workers}, indent=2))
        return 0
    print(f"{'worker':<12} {'role':<8} policy")
    for wid, role, policy in rows:
        print(f"{wid:<12} {role:<8} {format_policy(policy)}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    """`tetriserve status`: one line per worker with its state, policy and load."""
    with connect(args) as client:
        st = client.cluster_status(timeout=10)
    if args.json:
        workers = [
            {
                "worker_id": w.worker_id,
                "role": w.role,
                "state": w.state,
                "health": w.health,
                "incarnation": w.incarnation,
                "restarts": w.restarts,
                "lifecycle": w.lifecycle,
                "flips": w.flips,
                "last_flip_ms": w.last_flip_ms,
                "last_flip_switch_ms": w.last_flip_switch_ms,
                "last_flip_engine_ms": w.last_flip_engine_ms,
                "transport": w.transport,
                "policy": dict(w.policy),
                "load": dict(w.load),
            }
            for w in st.workers
        ]
        status = {
            "model": st.model,
            "requests_in_flight": st.requests_in_flight,
            "dashboard_url": st.dashboard_url,
            "preset": st.preset or None,
            "mode": st.mode,
            "workers": workers,
        }
        print(json.dumps(status, indent=2))
        return 0
    policies = [format_policy(w.policy) for w in st.workers]
    width = max([len("policy"), *map(len, policies)])
    print(
        f"model {st.model}   preset {st.preset or '-'}   mode {st.mode or '-'}   in flight {st.requests_in_flight}   "
        f"dashboard {st.dashboard_url or '-'}"
    )
    print(
        f"{'worker':<12} {'role':<8} {'state':<10} {'life':>4} {'restarts':>8} {'flips':>5} {'last_flip':>9} "
        f"{'swap':>8} {'kv':<4} {'policy':<{width}} load"
    )
    for w, policy in zip(st.workers, policies, strict=True):
        load = " ".join(f"{k}={v:g}" for k, v in sorted(w.load.items()))
        state = w.state if w.health in ("", "serving", w.state) else f"{w.state}/{w.health}"
        if w.lifecycle in ("draining", "flipping"):
            state = w.lifecycle
        last = "-" if w.last_flip_ms is None else f"{w.last_flip_ms / 1e3:.1f}s"
        swap = "-" if w.last_flip_engine_ms is None else f"{w.last_flip_engine_ms:.1f}ms"
        print(
            f"{w.worker_id:<12} {w.role:<8} {state:<10} {w.incarnation:>4} {w.restarts:>8} {w.flips:>5} {last:>9} "
            f"{swap:>8} {w.transport or '-':<4} "
            f"{policy:<{width}} {load}"
        )
    return 0
