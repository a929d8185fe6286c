"""Where a test cluster's start-up goes (the suite's time is mostly cluster start-ups).

    python benchmarks/diagnostics/cluster_startup.py [--idle-s 30]

Launches the integration tests' cluster (``tests/integration/conftest.py``'s ``CONFIG_OVERRIDES``: 1 prefill +
1 decode worker) and then a second one on the same Ray, as a test module's own cluster is, and prints how long
``ray.init`` and every ``ray.get`` in ``launch`` over 0.5 s took (the longest is the workers' ``start``: their
processes, imports, engines and predictors). The workers' own log lines, with their times, follow on stderr.
With ``--idle-s S``, between the two launches: after 20 s of rest, the CPU the idle service's processes (this
one and every process it started: Ray's, the actors', the predictors') take over S seconds, by process.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

T0 = time.monotonic()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.integration
import ray  # noqa: E402

from tests.integration.conftest import CONFIG_OVERRIDES  # noqa: E402
from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir  # noqa: E402
from tetriserve.common.config import ClusterConfig  # noqa: E402
from tetriserve.control_plane import launcher  # noqa: E402


def stamp(what: str, started: float) -> None:
    print(f"{what}: {time.monotonic() - started:.1f} s (at {time.monotonic() - T0:.1f} s)", flush=True)


def idle_cpu(seconds: float) -> None:
    """Print the CPU the processes of this process's tree take over ``seconds``, as % of one core."""
    import psutil

    def snap() -> dict[int, tuple[str, float]]:
        me = psutil.Process()
        out = {}
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                out[p.pid] = (" ".join(p.cmdline())[:80], t.user + t.system)
            except psutil.Error:
                continue
        return out

    time.sleep(20)
    before = snap()
    time.sleep(seconds)
    after = snap()
    rows = sorted(((t - before.get(pid, (c, 0.0))[1], pid, c) for pid, (c, t) in after.items()), reverse=True)
    for used, pid, cmd in rows[:12]:
        print(f"idle CPU {100 * used / seconds:5.1f} % of a core  {pid} {cmd}", flush=True)
    print(f"idle CPU in all: {100 * sum(r[0] for r in rows) / seconds:.1f} % of a core over {seconds:g} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-s", type=float, default=0.0)
    args = ap.parse_args()
    stamp("imports", T0)
    model = str(build_tiny_model(default_tiny_model_dir()))
    init_ray, get = launcher.init_ray, ray.get

    def timed_init(config: ClusterConfig) -> tuple[bool, str]:
        started = time.monotonic()
        out = init_ray(config)
        stamp("ray.init", started)
        return out

    def timed_get(refs: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        out = get(refs, *args, **kwargs)
        if time.monotonic() - started > 0.5:
            stamp("ray.get", started)
        return out

    launcher.init_ray, ray.get = timed_init, timed_get
    started = time.monotonic()
    first = launcher.launch(ClusterConfig.load(overrides=CONFIG_OVERRIDES), model)
    stamp("launch", started)
    if args.idle_s > 0:
        idle_cpu(args.idle_s)
    started = time.monotonic()
    second = launcher.launch(ClusterConfig.load(overrides={**CONFIG_OVERRIDES, "namespace": "second"}), model)
    stamp("second launch, same Ray", started)
    second.shutdown()
    first.shutdown()


if __name__ == "__main__":
    main()
