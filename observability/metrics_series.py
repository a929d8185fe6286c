"""Every metric the service exports, and the series a ``MetricsSnapshot`` gives each: the one table of names.

Names follow vLLM's (``vllm:num_requests_running`` ...) with ``tetriserve:`` in
front for Prometheus and ``tetriserve_`` for ``ray.util.metrics`` (Ray forbids
``:``); a counter's name here has no ``_total`` (Prometheus text adds it).
Per-worker series carry ``worker`` and ``role`` (its role now: a flipped
worker's counters go on under its new role's label). ``SPECS`` is the table
the exporter (``metrics.py``), the generated metrics reference (``docs/reference/metrics.md``) and the
Grafana lint test read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tetriserve.observability.metrics_stats import HistogramStats, MetricsSnapshot, WorkerStats

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
W = ("worker", "role")  # the labels of a per-worker series


@dataclass(frozen=True)
class MetricSpec:
    name: str  # without prefix (and, for a counter, without ``_total``)
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    ray: bool = True  # published through ray.util.metrics too (False: worker_gauges.py publishes it there)


SPECS: tuple[MetricSpec, ...] = (
    # -- the front door's view of its requests (vLLM's buckets) --------------------------------------------
    MetricSpec("time_to_first_token_seconds", HISTOGRAM, "Time to first token, from request received."),
    MetricSpec("inter_token_latency_seconds", HISTOGRAM, "Gap between a request's successive output tokens."),
    MetricSpec("time_per_output_token_seconds", HISTOGRAM, "A request's mean gap after its first token."),
    MetricSpec("e2e_request_latency_seconds", HISTOGRAM, "Request latency, from received to its last token."),
    MetricSpec("prompt_tokens", COUNTER, "Prompt tokens of the requests served."),
    MetricSpec("generation_tokens", COUNTER, "Tokens generated for clients."),
    MetricSpec("request_success", COUNTER, "Requests that ended normally.", ("finished_reason",)),
    MetricSpec("request_aborts", COUNTER, "Requests aborted: client (abort call), disconnect.", ("reason",)),
    MetricSpec("request_errors", COUNTER, "Requests that failed: backend, unavailable, ...", ("reason",)),
    MetricSpec("request_refusals", COUNTER, "Requests refused with 429: admission, placement.", ("reason",)),
    MetricSpec(
        "request_migrations",
        COUNTER,
        "Requests moved: an attempt lost and placed again (worker_lost, idle_timeout, worker_gave_up, "
        "worker_unavailable), or an SCLS slice move (slice_move).",
        ("reason",),
    ),
    MetricSpec("frontdoor_requests_running", GAUGE, "Requests this front door streams that are decoding."),
    MetricSpec("frontdoor_requests_queued", GAUGE, "Requests this front door admitted that wait to decode."),
    # -- the cluster ------------------------------------------------------------------------------------
    MetricSpec("cluster_up", GAUGE, "1 when the cluster answered this scrape."),
    MetricSpec("requests_in_flight", GAUGE, "Requests in the GlobalScheduler's table."),
    MetricSpec(
        "cluster_info",
        GAUGE,
        "1, labelled with the service's preset (the paper's configuration it runs; none: no preset) and mode "
        "(disaggregated, colocated).",
        ("preset", "mode"),
    ),
    MetricSpec("scheduler_requests", COUNTER, "The GlobalScheduler's request counts.", ("outcome",)),
    MetricSpec(
        "prefix_placements",
        COUNTER,
        "Requests prefix placement sent off least-load's choice, to a worker expected to hold more of the prompt.",
    ),
    MetricSpec(
        "prefix_expected_hit_tokens",
        COUNTER,
        "Prompt tokens placement expected the chosen prefill worker's cache to hold (engine_prompt_tokens "
        "source=cached: what it held).",
    ),
    MetricSpec("num_requests_running", GAUGE, "Requests running on the worker.", W),
    MetricSpec("num_requests_waiting", GAUGE, "Requests queued on the worker.", W),
    MetricSpec("kv_cache_usage_perc", GAUGE, "KV cache usage, 0..1 (1 = full).", W),
    MetricSpec(
        "prefill_queue_wait_seconds",
        GAUGE,
        "A prefill worker's expected wait to prefill its queue, as admission.max_wait_s bounds it.",
        W,
    ),
    MetricSpec(
        "prefill_seconds_per_token",
        GAUGE,
        "What a queued prompt token adds to that wait: the engine's seconds per prompt token, scaled by the share "
        "of a backlog prefilled here (the rest offloaded to decode workers), measured while prompts wait for the "
        "engine; 0: not measured.",
        W,
    ),
    MetricSpec("num_preemptions", COUNTER, "Preemptions on the worker's engine.", W),
    MetricSpec(
        "policy_decisions",
        COUNTER,
        "Decisions a configured policy took otherwise than the default would (FCFS order, greedy admission, "
        "vLLM's preemption), by policy and decision: what a switched-on paper's policy is doing.",
        (*W, "policy", "decision"),
    ),
    MetricSpec("engine_prompt_tokens", COUNTER, "Prompt tokens by source: computed, cached, external.", (*W, "source")),
    MetricSpec("engine_generation_tokens", COUNTER, "Tokens the worker's engine generated.", W),
    MetricSpec(
        "engine_step_seconds",
        COUNTER,
        "Seconds inside engine steps by clock: wall, and cpu (the stepping thread's own CPU time; well below wall: "
        "the engine waited for a core or for its process's interpreter lock).",
        (*W, "clock"),
    ),
    MetricSpec("engine_steps", COUNTER, "Engine steps taken (engine_step_seconds / engine_steps: time per step).", W),
    MetricSpec(
        "engine_borrowed_steps",
        COUNTER,
        "Engine steps taken with cores borrowed from idle engines (CPU; engine.cpu.borrow_idle_cores).",
        W,
    ),
    MetricSpec(
        "engine_step_context_switches",
        COUNTER,
        "Context switches of an engine's stepping thread inside its steps: slept (waited for its process's "
        "interpreter lock, mostly: the worker's other threads held it) or preempted (another thread took its core).",
        (*W, "kind"),
    ),
    MetricSpec("kv_transfer_bytes", COUNTER, "KV cache bytes sent / received.", (*W, "direction")),
    MetricSpec("kv_transfers", COUNTER, "KV transfers sent / received / pulled (one-sided).", (*W, "direction")),
    MetricSpec("kv_transfer_failures", COUNTER, "KV sends that failed.", W),
    MetricSpec(
        "kv_transfer_seconds",
        COUNTER,
        "Seconds spent on completed KV sends (send to acknowledgement; a pulled part: handing over where it lies).",
        W,
    ),
    MetricSpec("worker_role", GAUGE, "1 for the worker's role now, 0 for the other.", W, ray=False),
    MetricSpec("worker_flips", COUNTER, "Role changes of the worker.", ("worker",), ray=False),
    MetricSpec("worker_restarts", COUNTER, "Times the supervisor re-created the worker.", ("worker",)),
    MetricSpec(
        "length_predictions",
        COUNTER,
        "Finished requests by where their length fell against the predicted bucket: under, within, over.",
        (*W, "predictor", "outcome"),
    ),
    MetricSpec(
        "length_prediction_abs_error_tokens",
        COUNTER,
        "Summed absolute error, actual minus predicted output tokens.",
        (*W, "predictor"),
    ),
    MetricSpec(
        "kv_handoffs",
        COUNTER,
        "Requests a prefill worker handed to decode workers, by how their KV went: pipelined (each chunk's as it "
        "was computed), whole (after the prefill), or offloaded (none: the decode worker computed the prompt).",
        (*W, "mode"),
    ),
    MetricSpec(
        "length_prediction_timing",
        COUNTER,
        "Handoffs with the prediction on time, late, or refined later.",
        (*W, "timing"),
    ),
)
SPECS_BY_NAME = {s.name: s for s in SPECS}
ROLES = ("prefill", "decode", "colocated")
# the GlobalScheduler's placement counts (``GlobalScheduler.status``'s ``placements``) -> their series
PLACEMENT_COUNTS = {"placed_by_prefix": "prefix_placements", "prefix_hit_tokens": "prefix_expected_hit_tokens"}


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float | HistogramStats


def series(snap: MetricsSnapshot) -> Iterator[Series]:
    """Every series of ``snap``, named as in ``SPECS``."""
    fd = snap.frontdoor
    yield Series("time_to_first_token_seconds", (), fd.ttft)
    yield Series("inter_token_latency_seconds", (), fd.itl)
    yield Series("time_per_output_token_seconds", (), fd.tpot)
    yield Series("e2e_request_latency_seconds", (), fd.e2e)
    yield Series("prompt_tokens", (), fd.prompt_tokens)
    yield Series("generation_tokens", (), fd.generation_tokens)
    for name, counts, key in (
        ("request_success", fd.success, "finished_reason"),
        ("request_aborts", fd.aborts, "reason"),
        ("request_errors", fd.errors, "reason"),
        ("request_refusals", fd.refusals, "reason"),
    ):
        yield from (Series(name, ((key, k),), v) for k, v in sorted(counts.items()))
    yield Series("frontdoor_requests_running", (), fd.running)
    yield Series("frontdoor_requests_queued", (), fd.queued)
    cl = snap.cluster
    yield Series("cluster_up", (), float(cl is not None))
    if cl is None:
        return
    migrations = dict(cl.migrations)
    migrations["slice_move"] = int(cl.scheduler_counts.get("moved", 0))
    yield from (Series("request_migrations", (("reason", k),), v) for k, v in sorted(migrations.items()))
    yield Series("requests_in_flight", (), cl.requests_in_flight)
    yield Series("cluster_info", (("preset", cl.preset or "none"), ("mode", cl.mode)), 1)
    counts = {k: v for k, v in cl.scheduler_counts.items() if k not in PLACEMENT_COUNTS}
    yield from (Series("scheduler_requests", (("outcome", k),), v) for k, v in sorted(counts.items()))
    for key, name in PLACEMENT_COUNTS.items():
        if key in cl.scheduler_counts:
            yield Series(name, (), cl.scheduler_counts[key])
    for w in cl.workers:
        yield from _worker_series(w)


def _worker_series(w: WorkerStats) -> Iterator[Series]:
    tags = (("worker", w.worker), ("role", w.role))
    yield Series("num_requests_running", tags, w.running)
    yield Series("num_requests_waiting", tags, w.waiting)
    yield from (Series("worker_role", (("worker", w.worker), ("role", r)), float(r == w.role)) for r in ROLES)
    yield Series("worker_flips", (("worker", w.worker),), w.flips)
    yield Series("worker_restarts", (("worker", w.worker),), w.restarts)
    if w.queue_wait_s is not None:  # from its load report
        yield Series("prefill_queue_wait_seconds", tags, w.queue_wait_s)
        yield Series("prefill_seconds_per_token", tags, w.seconds_per_token)
    if not w.answered:  # its engine's figures are unknown this time: no series rather than zeros
        return
    yield Series("kv_cache_usage_perc", tags, w.kv_usage)
    yield Series("num_preemptions", tags, w.preemptions)
    for (policy, decision), n in sorted(w.decisions.items()):
        yield Series("policy_decisions", (*tags, ("policy", policy), ("decision", decision)), n)
    yield from (Series("engine_prompt_tokens", (*tags, ("source", k)), v) for k, v in w.prompt_tokens.items())
    yield Series("engine_generation_tokens", tags, w.generation_tokens)
    yield from (Series("engine_step_seconds", (*tags, ("clock", k)), v) for k, v in w.step_seconds.items())
    yield Series("engine_steps", tags, w.steps)
    yield Series("engine_borrowed_steps", tags, w.borrowed_steps)
    yield from (Series("engine_step_context_switches", (*tags, ("kind", k)), v) for k, v in w.step_switches.items())
    yield from (Series("kv_transfer_bytes", (*tags, ("direction", k)), v) for k, v in w.kv_bytes.items())
    for k, v in w.kv_transfers.items():
        if k == "failed":
            yield Series("kv_transfer_failures", tags, v)
        else:
            yield Series("kv_transfers", (*tags, ("direction", k)), v)
    yield Series("kv_transfer_seconds", tags, w.kv_seconds_sending)
    for (source, outcome), n in sorted(w.length_score.counts.items()):
        yield Series("length_predictions", (*tags, ("predictor", source), ("outcome", outcome)), n)
    for source, err in sorted(w.length_score.abs_error.items()):
        yield Series("length_prediction_abs_error_tokens", (*tags, ("predictor", source)), err)
    yield from (Series("length_prediction_timing", (*tags, ("timing", k)), v) for k, v in w.predictions.items())
    yield from (Series("kv_handoffs", (*tags, ("mode", k)), v) for k, v in w.handoffs.items())
