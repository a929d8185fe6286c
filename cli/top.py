"""`tetriserve top`: a live terminal view of a running service's metrics (its HTTP port's ``GET /metrics``).

    tetriserve top [--url http://localhost:8000] [--interval 2] [--once]

Every ``--interval`` seconds it scrapes ``/metrics`` and redraws one frame:
requests by outcome, tokens (and their rates between frames), latency
quantiles (estimated from the histograms' buckets, as PromQL's
``histogram_quantile``, over everything since the front door started), and one
line per worker: role, queues, KV usage, preemptions, KV traffic, flips,
length predictions within their bucket. ``--once`` prints one frame and exits
(no rates: they need two scrapes).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

DEFAULT_URL = "http://localhost:8000"
P = "tetriserve:"
Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """Sample values by name and labels (names as exposed: ``_total``, ``_bucket`` ...), and when."""

    at: float
    values: dict[str, dict[Labels, float]] = field(default_factory=lambda: defaultdict(dict))

    def get(self, name: str, **labels: str) -> float:
        """The sum over the series of ``name`` that match ``labels``."""
        want = set(labels.items())
        return sum(v for k, v in self.values.get(P + name, {}).items() if want <= set(k))

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """``name``'s values summed by one label's value."""
        want = set(labels.items())
        out: defaultdict[str, float] = defaultdict(float)
        for k, v in self.values.get(P + name, {}).items():
            if want <= set(k):
                out[dict(k).get(label, "")] += v
        return dict(out)


def parse(text: str, at: float) -> Scrape:
    scrape = Scrape(at)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            scrape.values[s.name][tuple(sorted(s.labels.items()))] = float(s.value)
    return scrape


def fetch(url: str, timeout: float = 10.0) -> Scrape:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
        return parse(resp.read().decode(), time.monotonic())


def quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """PromQL's ``histogram_quantile`` over cumulative ``le`` buckets (None: no observations)."""
    pairs = sorted((math.inf if le == "+Inf" else float(le), n) for le, n in buckets.items())
    if not pairs or pairs[-1][1] <= 0:
        return None
    rank, prev_le, prev_n = q * pairs[-1][1], 0.0, 0.0
    for le, n in pairs:
        if n >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / (n - prev_n) if n > prev_n else 1.0)
        prev_le, prev_n = le, n
    return prev_le


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}ms"


def _counts(d: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items()) if v) or "0"


def frame(now: Scrape, prev: Scrape | None = None, url: str = "") -> str:
    """One screen of figures from ``now`` (rates from ``prev`` when given)."""
    dt = now.at - prev.at if prev is not None else 0.0

    def rate(name: str) -> str:
        if prev is None or dt <= 0:
            return ""
        return f" (+{(now.get(name) - prev.get(name)) / dt:.1f}/s)"

    up = "up" if now.get("cluster_up") else "DOWN"
    lines = [
        f"tetriserve top  {url}  {time.strftime('%H:%M:%S')}   cluster {up}   "
        f"in flight {now.get('requests_in_flight'):.0f}   here: running {now.get('frontdoor_requests_running'):.0f}"
        f" queued {now.get('frontdoor_requests_queued'):.0f}",
        f"requests  ok {_counts(now.by('request_success_total', 'finished_reason'))}   "
        f"aborts {_counts(now.by('request_aborts_total', 'reason'))}   "
        f"errors {_counts(now.by('request_errors_total', 'reason'))}   "
        f"refused {_counts(now.by('request_refusals_total', 'reason'))}   "
        f"migrated {_counts(now.by('request_migrations_total', 'reason'))}",
        f"tokens    prompt {now.get('prompt_tokens_total'):.0f}{rate('prompt_tokens_total')}   "
        f"generation {now.get('generation_tokens_total'):.0f}{rate('generation_tokens_total')}",
    ]
    parts = []
    for label, name in (("TTFT", "time_to_first_token_seconds"), ("ITL", "inter_token_latency_seconds"),
                        ("TPOT", "time_per_output_token_seconds"), ("E2E", "e2e_request_latency_seconds")):  # fmt: skip
        buckets = now.by(name + "_bucket", "le")
        parts.append(f"{label} p50 {_ms(quantile(0.5, buckets))} p99 {_ms(quantile(0.99, buckets))}")
    lines.append("latency   " + "   ".join(parts))
    lines.append(
        f"{'worker':<12} {'role':<8} {'run':>4} {'wait':>4} {'kv%':>5} {'preempt':>7} "
        f"{'kv sent MB':>10} {'kv recv MB':>10} {'flips':>5} {'in bucket':>9}"
    )
    roles = now.values.get(P + "worker_role", {})
    for key, value in sorted(roles.items()):
        if not value:
            continue
        tags = dict(key)
        w, role = tags["worker"], tags["role"]
        scored = now.by("length_predictions_total", "outcome", worker=w)
        total = sum(scored.values())
        hit = f"{100 * scored.get('within', 0) / total:.0f}%" if total else "-"
        lines.append(
            f"{w:<12} {role:<8} {now.get('num_requests_running', worker=w):>4.0f} "
            f"{now.get('num_requests_waiting', worker=w):>4.0f} {100 * now.get('kv_cache_usage_perc', worker=w):>5.1f} "
            f"{now.get('num_preemptions_total', worker=w):>7.0f} "
            f"{now.get('kv_transfer_bytes_total', worker=w, direction='sent') / 1e6:>10.1f} "
            f"{now.get('kv_transfer_bytes_total', worker=w, direction='received') / 1e6:>10.1f} "
            f"{now.get('worker_flips_total', worker=w):>5.0f} {hit:>9}"
        )
    return "\n".join(lines)


def add_top_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("top", help="live view of a running service's metrics (its HTTP /metrics)")
    t.add_argument("--url", default=DEFAULT_URL, help="the OpenAI HTTP front door's base URL")
    t.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    t.add_argument("--once", action="store_true", help="print one frame and exit")


def run_top(args: argparse.Namespace) -> int:
    try:
        prev, now = None, fetch(args.url)
        if args.once:
            print(frame(now, None, args.url))
            return 0
        while True:
            sys.stdout.write("\x1b[2J\x1b[H" + frame(now, prev, args.url) + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
            prev, now = now, fetch(args.url)
    except OSError as exc:
        print(f"tetriserve: no metrics at {args.url}/metrics ({exc}); is `tetriserve serve` running?", file=sys.stderr)
        return 1
