"""Workers hurt by signals under streaming HTTP load: does every stream end whole and unchanged?

One `tetriserve serve --num-prefill 2 --num-decode 2` on this machine. First ``--streams`` streamed greedy
completions (``ignore_eos``, ``--max-tokens`` each) run at once undisturbed: the reference. Then, for each
scenario, the same requests at once while one thing is done to the workers' processes, as the kernel or an
operator would do it (Ray hears of it only from the process itself):

    sigstop-decode       the decode worker with the most running requests is stopped (SIGSTOP: a hung worker) for
                         --stop-s, then continued
    sigkill-prefill      prefill-0's process is killed (SIGKILL) as the prompts arrive
    sigkill-decode       the decode worker with the most running requests is killed mid-stream
    sigkill-both-decode  both decode workers' processes are killed at once

For each stream: its HTTP status, its finish reason, any error event, its time, and whether its text equals
the reference's. After each scenario, the time until every worker serves again (the supervisor's state, over
gRPC), and the attempts the front door placed again, by cause (its ``/metrics``). Writes
``benchmarks/results/<out>.{md,json}`` (default ``failure_signals``); prints a line as each scenario starts and
ends.

    python benchmarks/failure_signals.py --streams 12 --max-tokens 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import provenance, run_facts
from failure_kills import NAMESPACE, PORT, worker_restarts
from vllm_bench_report import RESULTS, WORK
from vllm_bench_serve import prepare, stop, tetriserve_cmd, wait_ready

URL = f"http://127.0.0.1:{PORT}"
SCENARIOS = ("sigstop-decode", "sigkill-prefill", "sigkill-decode", "sigkill-both-decode")
AT_S = {"sigstop-decode": 2.0, "sigkill-prefill": 0.05, "sigkill-decode": 2.0, "sigkill-both-decode": 2.0}


async def one(client: Any, i: int, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "tiny-llama",
        "prompt": f"story {i} " * (5 + 7 * i),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text, finish, errors, t0 = "", None, [], time.monotonic()
    async with client.stream("POST", URL + "/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": (await r.aread())[:300].decode(), "s": time.monotonic() - t0}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"])
                continue
            choice = event["choices"][0]
            text += choice.get("text") or ""
            finish = choice.get("finish_reason") or finish
    return {"status": 200, "finish": finish, "errors": errors, "s": time.monotonic() - t0, "text": text}


def pid_of(name: str) -> int:
    import ray

    return int(ray.get(ray.get_actor(name, namespace=NAMESPACE).__ray_call__.remote(lambda self: os.getpid())))


def busiest_decode() -> str:
    """The decode worker with the most running requests now (the cluster's status over gRPC)."""
    from tetriserve.client import TetriServeClient

    with TetriServeClient("127.0.0.1:50151", timeout=30) as client:
        workers = [w for w in client.cluster_status().workers if w.role == "decode"]
    return max(workers, key=lambda w: (w.load.get("running", 0), w.worker_id)).worker_id


def action(scenario: str, stop_s: float) -> Callable[[], None]:
    """What is done to the workers, its victims' pids looked up now (before the streams start)."""
    pids = {name: pid_of(name) for name in ("prefill-0", "decode-0", "decode-1")}

    def run() -> None:
        if scenario == "sigstop-decode":
            pid = pids[busiest_decode()]
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_s)
            with contextlib.suppress(ProcessLookupError):  # the supervisor killed it meanwhile
                os.kill(pid, signal.SIGCONT)
            return
        victims = {"sigkill-prefill": ["prefill-0"], "sigkill-decode": [busiest_decode()]}.get(
            scenario, ["decode-0", "decode-1"]
        )
        for victim in victims:
            os.kill(pids[victim], signal.SIGKILL)

    return run


async def streams(n: int, max_tokens: int, act: Callable[[], None] | None, at_s: float) -> list[dict[str, Any]]:
    import httpx

    async with httpx.AsyncClient() as client:
        tasks = [asyncio.create_task(one(client, i, max_tokens)) for i in range(n)]
        if act is not None:
            await asyncio.sleep(at_s)
            await asyncio.to_thread(act)
        return list(await asyncio.gather(*tasks))


def back_within(timeout_s: float = 300) -> float | None:
    """Seconds until every worker is active again (None: not within ``timeout_s``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if all(w["state"] == "active" for w in worker_restarts().values()):
                return time.monotonic() - t0
        except Exception:
            pass
        time.sleep(1)
    return None


def migrations() -> dict[str, float]:
    """The front door's ``tetriserve:request_migrations_total`` by reason."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"{URL}/metrics", timeout=30).read().decode()
    pattern = r'^tetriserve:request_migrations_total\{reason="([a-z_]+)"\} ([0-9.e+]+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def summarize(rows: list[dict[str, Any]], ref: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["s"] for r in rows]
    return {
        "streams": len(rows),
        "http_200": sum(r["status"] == 200 for r in rows),
        "ended_length": sum(r.get("finish") == "length" for r in rows),
        "error_events": sum(len(r.get("errors", [])) for r in rows),
        "same_text": sum(r.get("text") == q["text"] for r, q in zip(rows, ref, strict=True)),
        "differ": [
            _diverge(i, r.get("text") or "", q["text"])
            for i, (r, q) in enumerate(zip(rows, ref, strict=True))
            if r.get("text") != q["text"]
        ],
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
    }


def _diverge(stream: int, got: str, want: str) -> dict[str, Any]:
    """Where a stream's text first differs from the reference's, with some text either side."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return {
        "stream": stream,
        "at_char": at,
        "of": len(want),
        "got": got[at - 40 : at + 40],
        "want": want[at - 40 : at + 40],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--stop-s", type=float, default=25.0)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--out", default="failure_signals")
    parser.add_argument("--flags", default="", help="more `tetriserve serve` flags, e.g. '--dtype float32'")
    args = parser.parse_args()
    _, _, env = prepare()
    import ray

    report: dict[str, Any] = dict(run_facts())
    with open(WORK / "server_failure_signals.log", "w") as log:
        cmd = tetriserve_cmd("--num-prefill", "2", "--num-decode", "2", *shlex.split(args.flags))
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(URL, proc)
            ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
            asyncio.run(streams(args.streams, 16, None, 0))  # warm-up, not measured
            ref = asyncio.run(streams(args.streams, args.max_tokens, None, 0))
            report["undisturbed"] = summarize(ref, ref)
            for i, scenario in enumerate(args.scenarios, 1):
                print(f"== [{i}/{len(args.scenarios)}] {scenario}", flush=True)
                act, before = action(scenario, args.stop_s), migrations()
                rows = asyncio.run(streams(args.streams, args.max_tokens, act, AT_S[scenario]))
                moved = {k: int(v - before.get(k, 0)) for k, v in migrations().items() if v > before.get(k, 0)}
                report[scenario] = summarize(rows, ref) | {
                    "at_s": AT_S[scenario],
                    "back_within_s": back_within(),
                    "migrations": moved,
                }
                print(scenario, json.dumps(report[scenario]), flush=True)
        finally:
            ray.shutdown()
            stop(proc)
    write(report, args)
    return 0


def write(report: dict[str, Any], args: argparse.Namespace) -> None:
    (RESULTS / f"{args.out}.json").write_text(json.dumps(report, indent=1))
    head = "| run | action at s | streams | HTTP 200 | ended `length` | error events | same text as undisturbed |"
    lines = [
        "# Workers hurt by signals under streaming HTTP load",
        "",
        *provenance(report),
        f"`tetriserve serve --num-prefill 2 --num-decode 2 {args.flags}`".replace(" `", "`")
        + " (defaults otherwise; tiny random-weight Llama); "
        f"{args.streams} streamed greedy completions at once over HTTP, `ignore_eos`, {args.max_tokens} "
        f"tokens each, once undisturbed and once per scenario (see the script's docstring); SIGSTOP lasts "
        f"{args.stop_s:g} s. *Back within*: seconds after the streams ended until every worker was active again.",
        "",
        head + " median s | max s | back within s | attempts placed again, by cause |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in ["undisturbed", *args.scenarios]:
        r = report[name]
        back = r.get("back_within_s")
        cells = [
            name,
            f"{r['at_s']:g}" if "at_s" in r else "-",
            r["streams"],
            r["http_200"],
            r["ended_length"],
            r["error_events"],
            r["same_text"],
            f"{r['median_s']:.1f}",
            f"{r['max_s']:.1f}",
            "-" if "at_s" not in r else ("not within 300" if back is None else f"{back:.0f}"),
            ", ".join(f"{k} {v}" for k, v in sorted(r.get("migrations", {}).items())) or "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    differ = [(name, d) for name in args.scenarios for d in report[name]["differ"]]
    if differ:
        lines += ["", "Streams whose text differs from the undisturbed run's (where it first differs):", ""]
        for name, d in differ:
            lines.append(
                f"- {name}, stream {d['stream']}, at character {d['at_char']} of {d['of']}: "
                f"`{d['got']!r}` where undisturbed `{d['want']!r}`"
            )
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
