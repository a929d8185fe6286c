"""What the prefill→decode handoff's ``take`` costs as a Ray actor call, against the channel's link that carries
it (``channel/handoff.py``).

This times and meters ``take`` alone, between two async actors otherwise idle, with a request whose prompt has
``--prompt-tokens`` ids, over each channel in turn:

    ray     ``await decode.take.remote(req, ...)``: the call and its reply
    link    ``Link.call(Take(...))``: a DEALER on the caller's event loop to the callee's ``Endpoint`` (a
            ROUTER), msgpack both ways, as the handoff runs (``channel/core.py``)

Each channel runs twice: one call every 10 ms (``spaced``: each finds both sides idle; the round trip and
its one-way arrival, the callee's receipt by the machine's monotonic clock after the caller's send), and
eight at once back to back (``burst``, as in a burst's handoffs). CPU per call, in each process: its CPU time
(every thread: the event loop, Ray's and ZeroMQ's) over the calls, less that of as long a time idle.

    python benchmarks/diagnostics/handoff_call.py --calls 300 --prompt-tokens 300

Writes ``<--out>.{md,json}`` (in ``benchmarks/_work/diagnostics``) (default ``handoff_call``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import measure_or_reload

GAP_S = 0.01
BURST = 8  # calls at once in the burst mode
WARM_CALLS = 20


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def idle_cpu_s(seconds: float) -> float:
    """This process's CPU seconds over ``seconds`` of doing nothing (what the calls' figures subtract)."""
    c0 = cpu_s()
    await asyncio.sleep(seconds)
    return cpu_s() - c0


def make_actors() -> tuple[Any, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Decode:
        """The callee: answers ``take`` over Ray, and the same over its handoff endpoint."""

        def __init__(self) -> None:
            self.arrivals: list[float] = []

        async def take(self, *args: Any) -> bool:
            self.arrivals.append(time.monotonic())
            return True

        async def bind(self) -> tuple[str, bytes]:
            from tetriserve.channel import core
            from tetriserve.channel.handoff import HANDOFF_MESSAGES

            endpoint = core.Endpoint("127.0.0.1", "handoff bench", HANDOFF_MESSAGES, b"bench")
            self._task = asyncio.get_running_loop().create_task(endpoint.serve(lambda m: core.invoke(self, m)))
            return endpoint.address, b"bench"

        def ping(self) -> bool:
            return True

        def taken(self) -> list[float]:
            out, self.arrivals = self.arrivals, []
            return out

        def cpu(self) -> float:
            return cpu_s()

        async def idle(self, seconds: float) -> float:
            return await idle_cpu_s(seconds)

    @ray.remote(num_cpus=0)
    class Prefill:
        """The caller: ``n`` calls over one channel; (round trips in ms, send times, its CPU seconds)."""

        async def calls(self, channel: str, target: Any, n: int, prompt: int, burst: bool) -> dict[str, Any]:
            from tetriserve.channel import core
            from tetriserve.channel.handoff import Take
            from tetriserve.common.request import Request, SamplingSpec

            req = Request("bench-0", tuple(range(100, 100 + prompt)), SamplingSpec(max_tokens=256))
            link = None
            if channel == "link":
                address, token = target[1]
                link = core.Link(address, token + b":prefill-bench", "handoff bench", target[0].ping.remote)

            async def one() -> tuple[float, float]:
                sent = time.monotonic()
                if link is not None:
                    await link.call(Take(req, (7,), "frontdoor-bench"))
                else:
                    await target[0].take.remote(req, (7,), None, "frontdoor-bench", None, False)
                return sent, (time.monotonic() - sent) * 1e3

            out: list[tuple[float, float]] = []
            c0, t0 = cpu_s(), time.monotonic()
            for _ in range(0, n, BURST if burst else 1):
                if burst:
                    out += await asyncio.gather(*(one() for _ in range(BURST)))
                else:
                    out.append(await one())
                    await asyncio.sleep(GAP_S)
            used, wall = cpu_s() - c0, time.monotonic() - t0
            if link is not None:
                link.close()
            return {"sent": [s for s, _ in out], "trips": [t for _, t in out], "cpu_s": used, "wall_s": wall}

        async def idle(self, seconds: float) -> float:
            return await idle_cpu_s(seconds)

    return Prefill.remote(), Decode.remote()


def summary(run: dict[str, Any], arrivals: list[float], idle: tuple[float, float], n: int) -> dict[str, float]:
    trips = sorted(run["trips"])
    return {
        "round_trip_median_ms": statistics.median(trips),
        "round_trip_p90_ms": trips[int(0.9 * (len(trips) - 1))],
        "one_way_median_ms": statistics.median((a - s) * 1e3 for s, a in zip(run["sent"], arrivals, strict=True)),
        "caller_cpu_us_per_call": max(0.0, run["cpu_s"] - idle[0]) / n * 1e6,
        "callee_cpu_us_per_call": max(0.0, run["callee_cpu_s"] - idle[1]) / n * 1e6,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        prefill, decode = make_actors()
        server = ray.get(decode.bind.remote())
        results: dict[str, dict[str, float]] = {}
        for mode in ("spaced", "burst"):
            for channel in ("ray", "link"):
                target = (decode, server)
                ray.get(prefill.calls.remote(channel, target, WARM_CALLS, args.prompt_tokens, mode == "burst"))
                ray.get(decode.taken.remote())
                c0 = ray.get(decode.cpu.remote())
                run = ray.get(prefill.calls.remote(channel, target, args.calls, args.prompt_tokens, mode == "burst"))
                run["callee_cpu_s"] = ray.get(decode.cpu.remote()) - c0
                arrivals = ray.get(decode.taken.remote())
                idle = ray.get([prefill.idle.remote(run["wall_s"]), decode.idle.remote(run["wall_s"])])
                results[f"{channel} {mode}"] = summary(run, arrivals, (idle[0], idle[1]), args.calls)
    finally:
        ray.shutdown()
    return {"calls": args.calls, "prompt_tokens": args.prompt_tokens, "results": results}


def report(d: dict[str, Any]) -> str:
    lines = [
        "# The handoff's `take` call: a Ray actor call against the ZeroMQ handoff link",
        "",
        f"Command: `{d['command'].strip()}`  ",
        f"Two async Ray actors on this machine, otherwise idle; each call carries a request of {d['prompt_tokens']} "
        f"prompt tokens and is answered; {d['calls']} measured calls per channel and mode, after {WARM_CALLS} not "
        f"measured. `spaced`: one call every {GAP_S * 1e3:.0f} ms; `burst`: {BURST} at once, back to back. CPU per "
        "call: each process's CPU time (all its threads) over the calls, less that of as long a time idle. ms, µs.",
        "",
        "| channel, mode | round trip, median | p90 | one way, median | caller CPU µs/call | callee CPU µs/call |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in d["results"].items():
        trips = f"{r['round_trip_median_ms']:.3f} | {r['round_trip_p90_ms']:.3f} | {r['one_way_median_ms']:.3f}"
        cpu = f"{r['caller_cpu_us_per_call']:.0f} | {r['callee_cpu_us_per_call']:.0f}"
        lines.append(f"| {name} | {trips} | {cpu} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help=f"timed calls per channel (after {WARM_CALLS} not timed)")
    ap.add_argument("--prompt-tokens", type=int, default=300, help="ids in each call's payload")
    ap.add_argument("--out", default="handoff_call", help="report name under benchmarks/_work/diagnostics (.md, .json)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload(args.out, args.report_only, lambda: measure(args), report)


if __name__ == "__main__":
    sys.exit(main())
