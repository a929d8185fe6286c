"""What the prefill→decode ``take`` call costs as a Ray actor call, against a direct ZeroMQ request (issue #12).

The handoff's ``take`` is a Ray call from the prefill worker's actor to the decode worker's (``prefill_worker/
handoff.py``). This times that call alone, between two idle async actors, with a payload the size of a request's
prompt (``--prompt-tokens`` ids), one call every 10 ms (so each finds both sides idle), over each channel in
turn:

    ray     ``await decode.take.remote(payload)``: the call and its reply (what ``take`` costs today)
    zmq     the caller's DEALER socket sends the pickled payload to the callee's ROUTER socket, which answers;
            both on the actors' event loops (``zmq.asyncio``), as a direct handoff channel would run

and reports the median and 90th percentile round trip (ms) per channel, and its one-way arrival (the callee's
receipt, by the machine's monotonic clock, after the caller's send).

    python benchmarks/handoff_call.py --calls 300 --prompt-tokens 300

Writes ``benchmarks/results/<--out>.{md,json}`` (default ``handoff_call``).
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import measure_or_reload

GAP_S = 0.01
WARM_CALLS = 20


def make_actors() -> tuple[Any, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Decode:
        """The callee: answers ``take`` over Ray, and the same over a ROUTER socket."""

        async def take(self, payload: list[int]) -> float:
            return time.monotonic()

        async def bind(self) -> str:
            import zmq
            import zmq.asyncio

            self._sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            port = self._sock.bind_to_random_port("tcp://127.0.0.1")
            self._task = asyncio.get_running_loop().create_task(self._serve())
            return f"tcp://127.0.0.1:{port}"

        async def _serve(self) -> None:
            while True:
                ident, body = await self._sock.recv_multipart()
                pickle.loads(body)
                await self._sock.send_multipart([ident, pickle.dumps(time.monotonic())])

    @ray.remote(num_cpus=0)
    class Prefill:
        """The caller: ``n`` calls over one channel, ``GAP_S`` apart; (round trip, one way) in ms each."""

        async def over_ray(self, decode: Any, n: int, payload: list[int]) -> list[tuple[float, float]]:
            out = []
            for _ in range(n):
                sent = time.monotonic()
                arrived = await decode.take.remote(payload)
                out.append(((time.monotonic() - sent) * 1e3, (arrived - sent) * 1e3))
                await asyncio.sleep(GAP_S)
            return out

        async def over_zmq(self, address: str, n: int, payload: list[int]) -> list[tuple[float, float]]:
            import zmq
            import zmq.asyncio

            sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            sock.connect(address)
            out = []
            for _ in range(n):
                sent = time.monotonic()
                await sock.send(pickle.dumps(payload))
                arrived = pickle.loads(await sock.recv())
                out.append(((time.monotonic() - sent) * 1e3, (arrived - sent) * 1e3))
                await asyncio.sleep(GAP_S)
            sock.close(0)
            return out

    return Prefill.remote(), Decode.remote()


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    trips = sorted(s[0] for s in samples)
    return {
        "round_trip_median_ms": statistics.median(trips),
        "round_trip_p90_ms": trips[int(0.9 * (len(trips) - 1))],
        "one_way_median_ms": statistics.median(s[1] for s in samples),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        prefill, decode = make_actors()
        payload = list(range(100, 100 + args.prompt_tokens))
        address = ray.get(decode.bind.remote())
        results = {}
        for name, call in (("ray", lambda n: prefill.over_ray.remote(decode, n, payload)),
                           ("zmq", lambda n: prefill.over_zmq.remote(address, n, payload))):  # fmt: skip
            ray.get(call(WARM_CALLS))
            results[name] = summary(ray.get(call(args.calls)))
    finally:
        ray.shutdown()
    return {"calls": args.calls, "prompt_tokens": args.prompt_tokens, "results": results}


def report(d: dict[str, Any]) -> str:
    lines = [
        "# The handoff's `take` call: a Ray actor call against a direct ZeroMQ request",
        "",
        f"Command: `{d['command'].strip()}`  ",
        f"Two idle async Ray actors on this machine; each call carries {d['prompt_tokens']} token ids and is "
        f"answered; {d['calls']} timed calls per channel, {GAP_S * 1e3:.0f} ms apart, after {WARM_CALLS} not timed. "
        "ms.",
        "",
        "| channel | round trip, median | round trip, p90 | one way (callee's receipt), median |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, r in d["results"].items():
        trips = f"{r['round_trip_median_ms']:.3f} | {r['round_trip_p90_ms']:.3f}"
        lines.append(f"| {name} | {trips} | {r['one_way_median_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help=f"timed calls per channel (after {WARM_CALLS} not timed)")
    ap.add_argument("--prompt-tokens", type=int, default=300, help="ids in each call's payload")
    ap.add_argument("--out", default="handoff_call", help="report name under benchmarks/results (.md, .json)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    args = ap.parse_args()
    return measure_or_reload(args.out, args.report_only, lambda: measure(args), report, script="handoff_call")


if __name__ == "__main__":
    sys.exit(main())
