"""CPU an idle UCX transport uses: one pooled endpoint between two transports of one process.

    python benchmarks/diagnostics/ucx_idle_cpu.py
    python benchmarks/diagnostics/ucx_idle_cpu.py --variant blocking= --variant thread= \
        --env thread=UCXPY_PROGRESS_MODE=thread

Each ``--variant NAME=COMMIT`` (empty: the working tree) runs in a fresh process: two ``UcxTransport``s, one
1000-byte transfer between them (which leaves the sender's endpoint pooled and the receiver serving it), 0.5 s to
settle, then ``--idle-s`` seconds asleep; the process's CPU time over those seconds (every thread's) is the figure.
``--env NAME=VAR=VALUE`` sets an environment variable for one variant (e.g. the ucxx progress mode). A commit runs
through ``vllm_bench_report.checkout_env`` (a worktree first on ``PYTHONPATH``). Writes
``<out>.{md,json}`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from vllm_bench_report import RESULTS, checkout_env, code_state

CHILD = """
import sys, time
from tetriserve.transport.ucx import UcxTransport
rx, tx = UcxTransport(), UcxTransport()
assert tx.send(rx.address, "k", [b"x" * 1000], 5.0).wait(5.0).name == "DONE"
time.sleep(0.5)
cpu = time.process_time()
time.sleep(float(sys.argv[1]))
print("CPU_S", time.process_time() - cpu)
"""


def measure(env: dict[str, str], idle_s: float) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(idle_s)], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("CPU_S")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="NAME=COMMIT (empty: the working tree)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VAR=VALUE for one variant")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--out", default="ucx_idle_cpu")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"working tree": ""}
    rows = []
    for name, commit in variants.items():
        env = dict(os.environ)
        for item in args.env:
            who, var, value = item.split("=", 2)
            if who == name:
                env[var] = value
        if commit:
            env = checkout_env(commit, env)
        rows.append(
            {
                "variant": name,
                "commit": commit or code_state(),
                "cpu_s": measure(env, args.idle_s),
                "env": [e.split("=", 1)[1] for e in args.env if e.split("=", 1)[0] == name],
            }
        )
    result = {"command": sys.argv[1:], "idle_s": args.idle_s, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# CPU of an idle UCX transport (one pooled endpoint, two transports in one process)",
        "",
        f"Command: `python benchmarks/diagnostics/ucx_idle_cpu.py {' '.join(sys.argv[1:])}`  ",
        f"The process's CPU seconds over {args.idle_s:g} s asleep, after one 1000-byte transfer; each variant in a "
        "fresh process, one after another.",
        "",
        "| variant | code | environment | CPU s |",
        "| --- | --- | --- | ---: |",
    ]
    lines += [f"| {r['variant']} | {r['commit']} | {' '.join(r['env']) or '-'} | {r['cpu_s']:.2f} |" for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
