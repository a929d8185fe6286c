"""The pause after the first token: where the prefill→decode handoff spends its time, beside plain vLLM.

A disaggregated request's first token comes from the prefill worker and its second from the decode worker;
between them lie the dispatch, the KV transfer, the ``take`` call and the decode engine's first step. A
colocated vLLM server has one engine step there. This measures both systems in one run, same model, same
prompts, one streamed completion at a time (``--requests`` per prompt length, ``ignore_eos``, ``--max-tokens``,
temperature 1):

client side, per request     TTFT; the first inter-token gap (first → second token); the median of the rest
tetriserve, per request      from the GlobalScheduler's request table (each worker's state events, one clock):
                             first token out (prefill: ``TRANSFERRING``) → the decode worker has taken it
                             (``DECODE_QUEUED``, stamped by the prefill worker once ``take`` has returned)
                             and → the decode engine's first token (``DECODING``, stamped by the decode worker)

    python benchmarks/diagnostics/handoff_gap.py --requests 30 --prompt-tokens 64 512 1536 --max-tokens 256

With ``--background-rate R`` other requests arrive meanwhile, Poisson at R per second (non-streamed,
``BACKGROUND_PROMPT`` prompt tokens and ``BACKGROUND_TOKENS`` output tokens each, ``ignore_eos``), so the
handoff is measured on servers under load; tetriserve's state events then cover every request of the window,
the background's too. Writes ``<--out>.{md,json}`` (in ``benchmarks/_work/diagnostics``) (default ``handoff_gap``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from transfer_breakdown import NAMESPACE, prompt_ids, stream_one
from vllm_bench_report import RESULTS, WORK
from vllm_bench_serve import prepare, stop, tetriserve_cmd, vllm_server, wait_ready

BACKGROUND_PROMPT = 256
BACKGROUND_TOKENS = 128
OUT = "handoff_gap"
PORTS = {"tetriserve": 8100, "vllm": 8101}


class Background:
    """Poisson arrivals at ``rate`` per second until ``stop``: each a non-streamed completion in a thread of its own;
    ``stop`` waits for the ones in flight."""

    def __init__(self, port: int, rate: float) -> None:
        self.port, self.rate = port, rate
        self.requests: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if rate > 0:
            self._thread.start()

    def _run(self) -> None:
        rng = random.Random(0)
        while not self._stop.wait(rng.expovariate(self.rate)):
            prompt = prompt_ids(BACKGROUND_PROMPT, 100_000 + len(self.requests))
            self.requests.append(threading.Thread(target=self._one, args=(prompt,), daemon=True))
            self.requests[-1].start()

    def _one(self, prompt: list[int]) -> None:
        body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": BACKGROUND_TOKENS, "ignore_eos": True}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with contextlib.suppress(OSError):  # a refused or failed background request only lightens the load
            urllib.request.urlopen(req, timeout=120).read()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for request in self.requests:
            request.join()


def handoff_events(n: int) -> list[dict[str, float]]:
    """The last ``n`` finished requests' handoff intervals from the GlobalScheduler's table, oldest first."""
    import ray

    from tetriserve.common.request import RequestState

    ray.init(address="auto", namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    try:
        table = ray.get(ray.get_actor("global-scheduler", namespace=NAMESPACE).recent.remote(n))
    finally:
        ray.shutdown()
    out = []
    for req in sorted(table, key=lambda r: r.arrival_time):
        first = req.first_time(RequestState.TRANSFERRING)
        taken = req.first_time(RequestState.DECODE_QUEUED)
        decoding = req.first_time(RequestState.DECODING)
        if first is None or taken is None or decoding is None:
            continue
        out.append({"submit_ms": (taken - first) * 1e3, "to_decode_token_ms": (decoding - first) * 1e3})
    return out


def run_system(name: str, cmd: list[str], env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    port = PORTS[name]
    with open(WORK / f"server_handoff_{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            for i in range(3):  # warm-up, not measured
                stream_one(port, prompt_ids(256, -1 - i), 32)
            rows: dict[int, list[dict[str, float]]] = {}
            events: dict[int, list[dict[str, float]]] = {}
            salt = 0
            for length in args.prompt_tokens:
                rows[length] = []
                background = Background(port, args.background_rate)
                try:
                    for _ in range(args.requests):
                        salt += 1
                        rows[length].append(stream_one(port, prompt_ids(length, salt), args.max_tokens))
                finally:
                    background.stop()
                if name == "tetriserve":
                    events[length] = handoff_events(args.requests + len(background.requests))
                print(f"[{name}] {length}-token prompts: {len(rows[length])} requests", flush=True)
            return {"client": rows, "events": events}
        finally:
            stop(proc)


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def write_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    lengths = " ".join(map(str, args.prompt_tokens))
    cmd = (
        f"python benchmarks/diagnostics/handoff_gap.py --requests {args.requests} --prompt-tokens {lengths} "
        f"--max-tokens {args.max_tokens}"
    )
    if args.background_rate:
        cmd += f" --background-rate {args.background_rate:g}"
    if args.out != OUT:
        cmd += f" --out {args.out}"
    load = (
        f"Meanwhile other requests arrive, Poisson at {args.background_rate:g} per second ({BACKGROUND_PROMPT} "
        f"prompt tokens, {BACKGROUND_TOKENS} output tokens, not streamed); tetriserve's state events cover every "
        "request of the window, the background's too. "
        if args.background_rate
        else ""
    )
    lines = [
        "# The pause after the first token: tetriserve's prefill→decode handoff vs plain vLLM",
        "",
        f"Command: `{cmd}`  ",
        "One streamed completion at a time, `ignore_eos`, temperature 1; the same prompts for both "
        "systems, each on a fresh server warmed with 3 requests. Machine: 2 CPU cores, no GPU; tiny random-weight "
        "Llama. tetriserve: defaults (1 prefill + 1 decode). vLLM: `vllm.entrypoints.openai.api_server` as in "
        f"`vllm_bench_serve.py`. {load}Medians over the requests of each prompt length.",
        "",
        "## Client side (ms)",
        "",
        "| prompt tokens | system | TTFT | first → second token | later tokens (median gap) | chunks | "
        "end to end per output token |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for length in args.prompt_tokens:
        for name in ("tetriserve", "vllm"):
            rows = results[name]["client"][length]
            lines.append(
                f"| {length} | {name} | {med(rows, 'ttft_ms'):.2f} | {med(rows, 'first_gap_ms'):.2f} "
                f"| {med(rows, 'rest_gap_ms'):.3f} | {med(rows, 'chunks'):.0f} | {med(rows, 'e2e_per_token_ms'):.3f} |"
            )
    lines += [
        "",
        "A server whose chunks arrive together (a TTFT that holds most of the generation, gaps near 0) held its "
        "tokens back: its gaps then say little, and the end-to-end time per output token is the figure to compare.",
        "",
        "## tetriserve: the handoff from its state events (ms after the first token left the prefill worker)",
        "",
        "| prompt tokens | requests | decode worker has taken it (`take` returned) | decode engine's first token |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for length in args.prompt_tokens:
        ev = results["tetriserve"]["events"][length]
        lines.append(f"| {length} | {len(ev)} | {med(ev, 'submit_ms'):.2f} | {med(ev, 'to_decode_token_ms'):.2f} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps({"args": {k: v for k, v in vars(args).items() if k != "report_only"}, "results": results}, indent=1)
    )
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=30, help="requests per prompt length")
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512, 1536], help="prompt lengths")
    ap.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--background-rate", type=float, default=0.0, help="other requests per second meanwhile")
    ap.add_argument("--out", default=OUT, help="report name under benchmarks/_work/diagnostics (.md, .json)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON; run nothing")
    args = ap.parse_args()
    if args.report_only:
        data = json.loads((RESULTS / f"{args.out}.json").read_text())
        vars(args).update({k: v for k, v in data["args"].items() if k != "out"})  # the run's own
        saved = data["results"]
        results = {
            n: {part: {int(k): v for k, v in rows.items()} for part, rows in r.items()} for n, r in saved.items()
        }
        write_report(results, args)
        return 0
    model, _, env = prepare()
    results = {
        "tetriserve": run_system("tetriserve", tetriserve_cmd(), env, args),
        "vllm": run_system("vllm", *vllm_server(model, PORTS["vllm"], env), args),
    }
    write_report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
