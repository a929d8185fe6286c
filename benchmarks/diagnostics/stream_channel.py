"""CPU cost of one token message, worker → front door: Ray streaming generator vs ZeroMQ (channel/streams.py).

A Ray actor publishes one single-token chunk every ``--interval-ms`` (an engine
step of a one-stream decode) for ``--messages`` steps, over each channel in turn:

    ray     the actor's async generator yields each batch; the driver iterates the ObjectRefGenerator
            (``subscribe`` streams the batches)
    zmq     ``StreamHub.publish`` → one ``Chunks`` message from the actor's ``Sender`` → the driver's
            ``Endpoint`` (``channel/core.py``; ``StreamHub.serve`` attaches it, as the workers do)

and reports the CPU time (user + system, from ``getrusage``) each side spent per
message, the timer loop that paces the steps included on both channels.

    python benchmarks/diagnostics/stream_channel.py --messages 2000 --rounds 3

Writes ``stream_channel.md`` (in ``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_actor() -> Any:
    import ray

    @ray.remote
    class Publisher:
        def __init__(self) -> None:
            from tetriserve.channel.streams import StreamHub

            self.hub = StreamHub()

        def cpu(self) -> float:
            return cpu_s()

        def _chunk(self, i: int) -> Any:
            from tetriserve.common.stream import StreamChunk

            return StreamChunk("cmpl-0123456789ab", (i,), None, None, 120, "decode-0", index=i)

        async def by_ray(self, n: int, interval_s: float) -> Any:
            for i in range(n):
                yield [self._chunk(i)]
                await asyncio.sleep(interval_s)

        async def by_zmq(self, n: int, interval_s: float, address: str) -> None:
            async def drive() -> None:
                async for _ in self.hub.serve("bench", address, lambda: None, heartbeat_s=3600):
                    pass

            serving = asyncio.ensure_future(drive())
            for i in range(n):
                self.hub.publish("bench", self._chunk(i))
                await asyncio.sleep(interval_s)
            await asyncio.sleep(0.1)  # the last message leaves before the socket closes
            serving.cancel()

    return Publisher.remote()


async def one_round(actor: Any, channel: str, n: int, interval_s: float) -> tuple[float, float]:
    """(actor CPU µs per message, driver CPU µs per message)."""
    from tetriserve.channel import core
    from tetriserve.channel.streams import STREAM_MESSAGES

    a0, d0 = await actor.cpu.remote(), cpu_s()
    if channel == "ray":
        got = 0
        async for ref in actor.by_ray.remote(n, interval_s):
            got += len(await ref)
    else:
        endpoint = core.Endpoint("127.0.0.1", "stream bench", STREAM_MESSAGES)
        counted = [0]

        def count(batch: Any) -> None:
            counted[0] += sum(len(c.token_ids) for c in batch.chunks)

        serving = asyncio.ensure_future(endpoint.serve(count))
        await actor.by_zmq.remote(n, interval_s, endpoint.address)
        while counted[0] < n:
            await asyncio.sleep(0.01)
        got = counted[0]
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    a1, d1 = await actor.cpu.remote(), cpu_s()
    assert got == n, (channel, got)
    return 1e6 * (a1 - a0) / n, 1e6 * (d1 - d0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000, help="messages per channel per round")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="time between two messages")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds per channel")
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = make_actor()
    runs: dict[str, list[tuple[float, float]]] = {"ray": [], "zmq": []}

    async def all_rounds() -> None:
        await one_round(actor, "zmq", 100, args.interval_ms / 1000)  # warm-up: imports, connections
        await one_round(actor, "ray", 100, args.interval_ms / 1000)
        for r in range(args.rounds):
            for channel in ("ray", "zmq") if r % 2 == 0 else ("zmq", "ray"):
                runs[channel].append(await one_round(actor, channel, args.messages, args.interval_ms / 1000))
                worker, door = runs[channel][-1]
                print(f"{channel} round {r}: actor / driver µs per message {worker:.0f} / {door:.0f}")

    asyncio.run(all_rounds())
    ray.shutdown()
    lines = [
        "# Token messages, worker → front door: CPU per message",
        "",
        f"Command: `python benchmarks/diagnostics/stream_channel.py --messages {args.messages} "
        f"--interval-ms {args.interval_ms} --rounds {args.rounds}`  ",
        f"Machine: {os.cpu_count()} CPU cores. One single-token chunk every {args.interval_ms} ms; "
        "CPU time (user + system) per message, median over rounds (alternated), the pacing loop included.",
        "",
        "| channel | worker (sending) µs | front door (receiving) µs |",
        "| --- | ---: | ---: |",
    ]
    for channel, rows in runs.items():
        worker = statistics.median(r[0] for r in rows)
        door = statistics.median(r[1] for r in rows)
        lines.append(
            f"| {'Ray streaming generator' if channel == 'ray' else 'ZeroMQ (StreamHub)'} | {worker:.0f} | {door:.0f} |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stream_channel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
