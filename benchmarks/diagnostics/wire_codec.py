"""What one message costs the wire codec (``channel/core.py``): encode plus decode, per message type.

    python benchmarks/diagnostics/wire_codec.py [--prompt-tokens 300] [--calls 20000]

Times ``encode`` then ``decode`` of the intake's, the handoff's and the token streams' messages, with a request of
``--prompt-tokens`` prompt tokens where a message carries one (and a batch of 16 one-token chunks for the
streams); each figure is the best of three runs of
``--calls``, in microseconds per message. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from tetriserve.channel import core, handoff, intake, streams
from tetriserve.common.length import LengthEstimate
from tetriserve.common.request import Request, SamplingSpec
from tetriserve.common.stream import StreamChunk


def _per_call_us(message: Any, calls: int) -> float:
    best = float("inf")
    kinds = (type(message),)
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            core.decode(core.encode(message, 3), kinds)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    req = Request("r-1", tuple(range(args.prompt_tokens)), SamplingSpec(max_tokens=128, temperature=0.7))
    est = LengthEstimate(10, 20, 30, bucket=1, confidence=0.5, source="trained")
    batch = tuple(StreamChunk(f"r-{i}", (7,), worker="decode-0", index=40, attempt=1) for i in range(16))
    cases = [
        ("intake", "Submit", intake.Submit(req)),
        ("intake", "Abort", intake.Abort("r-1", 1)),
        ("handoff", "Take", handoff.Take(replace(req, length_estimate=est), (8,), "frontdoor-1")),
        ("handoff", "Refine", handoff.Refine("r-1", 2, est)),
        ("streams", "Chunks (16)", streams.Chunks(batch)),
    ]
    print("| channel | message | encode + decode, µs |\n| --- | --- | --- |")
    for channel, name, message in cases:
        print(f"| {channel} | {name} | {_per_call_us(message, args.calls):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
