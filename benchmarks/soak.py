"""A long run under steady mixed load with a kill every window: is anything lost, does anything grow?

One `tetriserve serve` (2 prefill + 2 decode workers, the tiny model) takes streaming completions over HTTP at
Poisson --rate for --duration-s, each with a ShareGPT prompt and a max_tokens drawn from --max-tokens (seeded).
The run is cut in windows of --window-s. At the start of every window after the first, one actor is killed with
``ray.kill``, in turn a prefill worker, a decode worker and the GlobalScheduler (the supervisor re-creates each).
At the end of each window no new request is sent until every one in flight has ended (the drain), and then the
service's footprint is read:

    pss_mib      proportional resident memory of every process of the service's session (Ray's included; shared
                 pages counted once over the processes that share them)
    fds          their open file descriptors
    shm_mib      /dev/shm in use
    objects_mib  the Ray object store in use (Ray's memory summary, as ``ray memory --stats-only`` prints it)
    kv_usage     the highest KV-cache usage any worker reports on /metrics (0 when every request has ended)

A request is lost when its stream does not end with a finish reason (an HTTP error other than 429, a broken
stream); 429s are counted apart (shed, as overload should be). The verdict: nothing lost, and each footprint
figure of the last window within --growth (default 10%) of the first window's, KV usage 0 after every drain.

    python benchmarks/soak.py --duration-s 3600 --window-s 600 --rate 1.0 --seed 0

Writes ``benchmarks/results/soak.{md,json}``; prints a line per window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import provenance, run_facts
from vllm_bench_report import RESULTS, WORK
from vllm_bench_serve import TETRISERVE_PORT, prepare, stop, tetriserve_cmd, wait_ready

NAMESPACE = "tetriserve"
URL = f"http://127.0.0.1:{TETRISERVE_PORT}"
VICTIMS = ("prefill", "decode", "global-scheduler")


@dataclass
class Window:
    index: int
    killed: str | None = None
    sent: int = 0
    ok: int = 0
    shed: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    pss_mib: float = 0.0
    fds: int = 0
    shm_mib: float = 0.0
    objects_mib: float | None = None
    kv_usage: float | None = None


def prompts(dataset: Path, n: int, rng: random.Random) -> list[str]:
    data = json.loads(dataset.read_text())
    texts = [c["conversations"][0]["value"][:1200] for c in data if c.get("conversations")]
    return [rng.choice(texts) for _ in range(n)]


async def one(session: Any, prompt: str, max_tokens: int, window: Window) -> None:
    import aiohttp

    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    finished, error = False, "the stream ended without a finish reason"
    try:
        async with session.post(f"{URL}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=600)) as r:
            if r.status == 429:
                window.shed += 1
                return
            if r.status != 200:
                error = f"HTTP {r.status}: {(await r.text())[:200]}"
            else:
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        error = f"error chunk: {json.dumps(chunk['error'])[:200]}"
                        break
                    finished |= any(c.get("finish_reason") for c in chunk.get("choices", []))
    except Exception as exc:  # a broken stream is a lost request
        error = f"{type(exc).__name__}: {exc}"[:200]
    if finished:
        window.ok += 1
    else:
        window.lost += 1
        window.errors.append(error)


async def load(window: Window, until: float, rate: float, texts: list[str], rng: random.Random, args: Any) -> None:
    import aiohttp

    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < until:
            prompt = texts[window.sent % len(texts)]
            max_tokens = rng.randint(*args.max_tokens)
            task = asyncio.create_task(one(session, prompt, max_tokens, window))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            window.sent += 1
            await asyncio.sleep(rng.expovariate(rate))
        drain = time.monotonic()
        if tasks:
            await asyncio.wait(tasks)
        window.drain_s = time.monotonic() - drain


def session_processes(sid: int) -> list[Any]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def footprint(window: Window, sid: int) -> None:
    import psutil

    pss = fds = 0
    for p in session_processes(sid):
        try:
            pss += p.memory_full_info().pss
            fds += p.num_fds()
        except psutil.Error:
            continue
    window.pss_mib, window.fds = pss / 2**20, fds
    window.shm_mib = shutil.disk_usage("/dev/shm").used / 2**20
    try:
        import ray
        from ray._private.internal_api import memory_summary

        out = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
        m = re.search(r"Plasma memory usage (\d+) MiB", out)
        window.objects_mib = float(m.group(1)) if m else None
    except Exception as exc:  # Ray's summary is an internal API: a run without it reports no figure
        print(f"[soak] no object store figure: {type(exc).__name__}: {exc}", flush=True)
        window.objects_mib = None
    try:
        with urllib.request.urlopen(f"{URL}/metrics", timeout=10) as r:
            text = r.read().decode()
        usages = [float(v) for v in re.findall(r"^\S*kv_cache_usage_perc\{[^}]*\} (\S+)$", text, re.M)]
        window.kv_usage = max(usages, default=None)
    except OSError:
        window.kv_usage = None


def kill(turn: int) -> str:
    import ray

    from tetriserve.client import TetriServeClient

    kind = VICTIMS[turn % len(VICTIMS)]
    if kind == "global-scheduler":
        name = kind
    else:
        with TetriServeClient(f"127.0.0.1:{50151}", timeout=30) as client:
            serving = sorted(w.worker_id for w in client.cluster_status().workers if w.state == "active")
        name = next((w for w in serving if w.startswith(kind)), f"{kind}-0")
    ray.kill(ray.get_actor(name, namespace=NAMESPACE))
    return name


def run(args: argparse.Namespace) -> list[Window]:
    import ray

    _, dataset, env = prepare()
    rng = random.Random(args.seed)
    texts = prompts(dataset, 2000, rng)
    windows: list[Window] = []
    with open(WORK / "server_soak.log", "w") as log:
        proc = subprocess.Popen(
            tetriserve_cmd("--num-prefill", "2", "--num-decode", "2"),
            cwd=WORK.parent.parent, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_ready(URL, proc)
            ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
            start = time.monotonic()
            for i in range(max(1, round(args.duration_s / args.window_s))):
                window = Window(i)
                if i > 0:
                    window.killed = kill(i - 1)
                asyncio.run(load(window, start + (i + 1) * args.window_s, args.rate, texts, rng, args))
                footprint(window, proc.pid)
                windows.append(window)
                print(
                    f"[soak] window {i}: killed {window.killed or '-'}, sent {window.sent}, ok {window.ok}, "
                    f"shed {window.shed}, lost {window.lost}, pss {window.pss_mib:.0f} MiB, fds {window.fds}, "
                    f"shm {window.shm_mib:.1f} MiB, objects {window.objects_mib} MiB, kv {window.kv_usage}",
                    flush=True,
                )
        finally:
            ray.shutdown()
            stop(proc)
    return windows


def verdict(windows: list[Window], growth: float) -> list[str]:
    first, last = windows[0], windows[-1]
    problems = [f"window {w.index}: {w.lost} lost ({'; '.join(w.errors[:3])})" for w in windows if w.lost]
    for name in ("pss_mib", "fds", "shm_mib", "objects_mib"):
        a, b = getattr(first, name), getattr(last, name)
        if a is not None and b is not None and b > a * (1 + growth) + (1 if name != "fds" else 4):
            problems.append(f"{name} grew from {a:.1f} to {b:.1f}")
    problems += [f"window {w.index}: KV usage {w.kv_usage} after the drain" for w in windows if w.kv_usage]
    return problems


def report(windows: list[Window], args: argparse.Namespace, facts: dict[str, str]) -> None:
    problems = verdict(windows, args.growth)
    head = "| window | killed | sent | ok | shed (429) | lost | drain s | PSS MiB | fds | /dev/shm MiB | objects MiB "
    lines = [
        "# Soak: steady load, a kill every window",
        "",
        *provenance(facts),
        "",
        head + "| KV usage |",
        "| --- " * 12 + "|",
    ]
    for w in windows:
        lines.append(
            f"| {w.index} | {w.killed or '-'} | {w.sent} | {w.ok} | {w.shed} | {w.lost} | {w.drain_s:.1f} | "
            f"{w.pss_mib:.0f} | {w.fds} | {w.shm_mib:.1f} | {w.objects_mib} | {w.kv_usage} |"
        )
    lines += ["", "Verdict: " + ("nothing lost, nothing grew." if not problems else "; ".join(problems)), ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines))
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps(
            {**facts, "args": vars(args), "windows": [asdict(w) for w in windows], "problems": problems}, indent=1
        )
    )
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--window-s", type=float, default=600.0, help="a kill at the start of each but the first")
    ap.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals, requests per second")
    ap.add_argument("--max-tokens", type=int, nargs=2, default=(16, 160), metavar=("MIN", "MAX"))
    ap.add_argument("--growth", type=float, default=0.10, help="the most a footprint figure may grow, first to last")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="soak")
    args = ap.parse_args()
    facts = run_facts()
    windows = run(args)
    report(windows, args, facts)
    return 1 if verdict(windows, args.growth) else 0


if __name__ == "__main__":
    raise SystemExit(main())
