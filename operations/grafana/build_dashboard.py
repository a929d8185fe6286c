"""Writes ``tetriserve-dashboard.json``, the Grafana dashboard of ``/metrics`` (``docs/observability/grafana.md``).

    python operations/grafana/build_dashboard.py        # rewrites the JSON next to this script

Rows: latency, throughput, queues, KV cache, KV transfer, roles, failures,
length predictor. Every query names only metrics the exporter serves
(``tests/unit/test_grafana_dashboard.py`` checks it against the exporter's registry).
The datasource is an import-time input (``DS_PROMETHEUS``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("tetriserve-dashboard.json")
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
R = "$__rate_interval"


def q(expr: str, legend: str = "") -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend, "datasource": DS}


def quantiles(metric: str) -> list[dict[str, Any]]:
    return [
        q(f"histogram_quantile({p}, sum by (le) (rate(tetriserve:{metric}_bucket[{R}])))", f"p{int(p * 100)}")
        for p in (0.5, 0.9, 0.99)
    ]


ROWS: list[tuple[str, list[tuple[str, str, list[dict[str, Any]]]]]] = [
    (
        "Latency (front door)",
        [
            ("Time to first token", "s", quantiles("time_to_first_token_seconds")),
            ("Inter-token latency", "s", quantiles("inter_token_latency_seconds")),
            ("Time per output token (per request)", "s", quantiles("time_per_output_token_seconds")),
            ("End-to-end request latency", "s", quantiles("e2e_request_latency_seconds")),
        ],
    ),
    (
        "Throughput",
        [
            (
                "Tokens / s",
                "short",
                [
                    q(f"sum(rate(tetriserve:prompt_tokens_total[{R}]))", "prompt"),
                    q(f"sum(rate(tetriserve:generation_tokens_total[{R}]))", "generation"),
                ],
            ),
            (
                "Requests finished / s",
                "reqps",
                [q(f"sum by (finished_reason) (rate(tetriserve:request_success_total[{R}]))", "{{finished_reason}}")],
            ),
            (
                "Engine tokens / s by worker",
                "short",
                [
                    q(f"sum by (worker) (rate(tetriserve:engine_generation_tokens_total[{R}]))", "{{worker}} gen"),
                    q(
                        f'sum by (worker) (rate(tetriserve:engine_prompt_tokens_total{{source="computed"}}[{R}]))',
                        "{{worker}} prefill",
                    ),
                ],
            ),
        ],
    ),
    (
        "Queues",
        [
            (
                "Running by worker",
                "short",
                [q("sum by (worker, role) (tetriserve:num_requests_running)", "{{worker}}")],
            ),
            (
                "Waiting by worker",
                "short",
                [q("sum by (worker, role) (tetriserve:num_requests_waiting)", "{{worker}}")],
            ),
            (
                "In flight",
                "short",
                [
                    q("max(tetriserve:requests_in_flight)", "cluster (scheduler table)"),
                    q("sum(tetriserve:frontdoor_requests_queued)", "front doors: waiting to decode"),
                    q("sum(tetriserve:frontdoor_requests_running)", "front doors: decoding"),
                ],
            ),
        ],
    ),
    (
        "KV cache",
        [
            (
                "KV cache usage",
                "percentunit",
                [q("max by (worker, role) (tetriserve:kv_cache_usage_perc)", "{{worker}}")],
            ),
            (
                "Preemptions / s",
                "short",
                [q(f"sum by (worker) (rate(tetriserve:num_preemptions_total[{R}]))", "{{worker}}")],
            ),
        ],
    ),
    (
        "KV transfer",
        [
            (
                "KV bytes / s",
                "Bps",
                [
                    q(
                        f"sum by (worker, direction) (rate(tetriserve:kv_transfer_bytes_total[{R}]))",
                        "{{worker}} {{direction}}",
                    )
                ],
            ),
            (
                "Mean KV send time",
                "s",
                [
                    q(
                        f"sum by (worker) (rate(tetriserve:kv_transfer_seconds_total[{R}])) / "
                        f'sum by (worker) (rate(tetriserve:kv_transfers_total{{direction="sent"}}[{R}]))',
                        "{{worker}}",
                    )
                ],
            ),
            (
                "KV transfer failures / s",
                "short",
                [q(f"sum by (worker) (rate(tetriserve:kv_transfer_failures_total[{R}]))", "{{worker}}")],
            ),
        ],
    ),
    (
        "Roles",
        [
            (
                "Workers by role",
                "short",
                [q("sum by (role) (max by (worker, role) (tetriserve:worker_role))", "{{role}}")],
            ),
            (
                "Role of each worker (1 = plays it)",
                "short",
                [q("max by (worker, role) (tetriserve:worker_role)", "{{worker}} {{role}}")],
            ),
            (
                "Flips and restarts",
                "short",
                [
                    q("max by (worker) (tetriserve:worker_flips_total)", "{{worker}} flips"),
                    q("max by (worker) (tetriserve:worker_restarts_total)", "{{worker}} restarts"),
                ],
            ),
        ],
    ),
    (
        "Failures",
        [
            ("Errors / s", "short", [q(f"sum by (reason) (rate(tetriserve:request_errors_total[{R}]))", "{{reason}}")]),
            ("Aborts / s", "short", [q(f"sum by (reason) (rate(tetriserve:request_aborts_total[{R}]))", "{{reason}}")]),
            (
                "Refusals (429) / s",
                "short",
                [q(f"sum by (reason) (rate(tetriserve:request_refusals_total[{R}]))", "{{reason}}")],
            ),
            (
                "Migrations / s",
                "short",
                [q(f"sum by (reason) (rate(tetriserve:request_migrations_total[{R}]))", "{{reason}}")],
            ),
            ("Cluster answering scrapes", "short", [q("min(tetriserve:cluster_up)", "up")]),
        ],
    ),
    (
        "Length predictor",
        [
            (
                "Requests in their predicted bucket",
                "percentunit",
                [
                    q(
                        f'sum(rate(tetriserve:length_predictions_total{{outcome="within"}}[{R}])) / '
                        f"sum(rate(tetriserve:length_predictions_total[{R}]))",
                        "within",
                    )
                ],
            ),
            (
                "Outcomes / s",
                "short",
                [q(f"sum by (outcome) (rate(tetriserve:length_predictions_total[{R}]))", "{{outcome}}")],
            ),
            (
                "Mean absolute error (tokens)",
                "short",
                [
                    q(
                        f"sum by (predictor) (rate(tetriserve:length_prediction_abs_error_tokens_total[{R}])) / "
                        f"sum by (predictor) (rate(tetriserve:length_predictions_total[{R}]))",
                        "{{predictor}}",
                    )
                ],
            ),
            (
                "Prediction at handoff",
                "short",
                [q(f"sum by (timing) (rate(tetriserve:length_prediction_timing_total[{R}]))", "{{timing}}")],
            ),
        ],
    ),
]


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False, "panels": [],
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})  # fmt: skip
        pid, y = pid + 1, y + 1
        width = 24 // len(row)
        for i, (name, unit, targets) in enumerate(row):
            panels.append(
                {
                    "type": "timeseries",
                    "title": name,
                    "id": pid,
                    "datasource": DS,
                    "gridPos": {"x": i * width, "y": y, "w": width, "h": 8},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [{**t, "refId": chr(ord("A") + k)} for k, t in enumerate(targets)],
                }
            )
            pid += 1
        y += 8
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "title": "tetriserve",
        "uid": "tetriserve",
        "tags": ["tetriserve", "llm", "vllm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(OUT)
